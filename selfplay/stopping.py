"""Stopping a command by a signal: SIGINT (Ctrl-C) or SIGTERM (`kill`, a job scheduler).

Both stop a command as Ctrl-C always has: a KeyboardInterrupt in the main thread, which every
part cleans up after (a run keeps its last whole checkpoint, a file being published is removed,
models are closed). The command then says in one line where it stopped, and ends with the
shell's code for the signal: 128 + its number (130 for SIGINT, 143 for SIGTERM).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def stop_signals() -> Iterator[list[signal.Signals]]:
    """Within the block, SIGINT and SIGTERM raise KeyboardInterrupt; the list yielded holds the
    signals received, in order. Outside the main thread, where Python runs no signal handler,
    nothing changes."""
    received: list[signal.Signals] = []

    def stop(number: int, frame) -> None:
        received.append(signal.Signals(number))
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {number: signal.signal(number, stop) for number in STOP_SIGNALS}
    try:
        yield received
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def exit_code(received: list[signal.Signals]) -> int:
    """The exit code of a command that a KeyboardInterrupt stopped: the shell's for the first
    signal received (a KeyboardInterrupt raised otherwise counts as Ctrl-C's)."""
    return 128 + (received[0] if received else signal.SIGINT)
