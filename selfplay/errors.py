"""The base of every error a user can cause with a setting, a spec or a file.

The command line reports these as one line naming the cause and the fix, with exit code 2;
anything else is a bug and keeps its traceback.
"""


class UserError(ValueError):
    """Something the user asked for cannot be done as asked; the message says what to change."""
