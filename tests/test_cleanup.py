"""Cleanup that runs every step whatever the others do, and reports the error that matters."""

from __future__ import annotations

import errno
import os

import pytest

from selfplay.cleanup import close_all


def refuse(error: BaseException):
    def step():
        raise error

    return step


def test_every_step_runs_the_first_error_is_raised_and_the_others_said_in_one_line(capsys):
    ran = []
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    steps = [
        ("closing the trackers", refuse(full)),
        ("closing the backend", lambda: ran.append("backend")),
        ("closing the league store", refuse(RuntimeError("the store\nis gone"))),
        ("releasing the lock", lambda: ran.append("lock")),
    ]
    with pytest.raises(OSError) as raised:
        close_all(steps)
    assert raised.value is full and ran == ["backend", "lock"]
    assert (
        capsys.readouterr().err
        == "warning: cleanup steps that failed too: closing the league store: the store is gone.\n"
    )


def test_cleaning_up_after_an_error_raises_none_and_says_each_failure(capsys):
    ran = []
    steps = [("closing the trackers", refuse(KeyboardInterrupt())), ("releasing the lock", lambda: ran.append("lock"))]
    close_all(steps, failing=True)
    assert ran == ["lock"]
    assert (
        capsys.readouterr().err == "warning: cleanup steps that failed too: closing the trackers: KeyboardInterrupt.\n"
    )
    close_all([("releasing the lock", lambda: None)])
    assert capsys.readouterr().err == ""
