"""The base of every error a user can cause with a setting, a spec or a file.

The command line reports these as one line naming the cause and the fix, with exit code 2;
anything else is a bug and keeps its traceback.
"""


class UserError(ValueError):
    """Something the user asked for cannot be done as asked; the message says what to change."""


def in_one_line(err: BaseException) -> str:
    """What `err` says, in one line: a library's error raised from its cause (a database's, a
    socket's) says it last, and the cause is what names the trouble."""
    while err.__cause__ is not None and str(err.__cause__).strip():
        err = err.__cause__
    said = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
    return " ".join(said.split()).rstrip(".") or type(err).__name__
