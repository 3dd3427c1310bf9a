"""The run directory's layout, which runs written by earlier versions of selfplay keep."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from selfplay.errors import UserError
from selfplay.run_dir import RunDir, RunLock


def test_the_layout_of_a_run_directory():
    run = RunDir("runs/a")
    assert run.config == Path("runs/a/config.yaml")
    assert run.checkpoints == Path("runs/a/checkpoints")
    assert run.league_store == Path("runs/a/league.sqlite")
    assert run.snapshot("main@000004") == Path("runs/a/league/snapshots/main@000004.safetensors")
    assert run.tensorboard == Path("runs/a/tensorboard")


def test_a_snapshot_file_names_its_run_directory():
    assert RunDir.of_snapshot("runs/a/league/snapshots/main@000004.safetensors") == RunDir("runs/a")
    assert RunDir.of_snapshot("league/snapshots/main@000004.safetensors") == RunDir(".")
    for elsewhere in ("runs/a/main@000004.safetensors", "runs/a/other/snapshots/main@4.safetensors", "x.pt"):
        assert RunDir.of_snapshot(elsewhere) is None


def test_the_league_store_files_include_sqlites_own(tmp_path):
    store = ["league.sqlite", "league.sqlite-shm", "league.sqlite-wal"]
    for name in [*store, "config.yaml"]:
        (tmp_path / name).touch()
    assert [path.name for path in RunDir(tmp_path).league_store_files()] == store


def test_a_directory_without_a_config_is_no_run_directory(tmp_path):
    with pytest.raises(UserError, match="is not a run directory: it has no config.yaml"):
        RunDir(tmp_path).saved_config()
    RunDir(tmp_path).config.write_text("steps: 1\n")
    assert RunDir(tmp_path).saved_config() == tmp_path / "config.yaml"


def hold_lock_in_another_process(run_dir: Path) -> subprocess.Popen:
    """A process that takes the run directory's lock and waits; returned once it holds it."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom selfplay.run_dir import RunLock\n"
         "RunLock(sys.argv[1]); print('held', flush=True); time.sleep(600)", str(run_dir)],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert holder.stdout.readline() == "held\n"
    return holder


def test_a_run_directory_is_locked_by_one_process_and_freed_by_its_death_even_by_kill_9(tmp_path):
    run_dir = tmp_path / "run"
    holder = hold_lock_in_another_process(run_dir)
    try:
        with pytest.raises(UserError, match=rf"in use by another selfplay process \(PID {holder.pid}\)"):
            RunLock(run_dir)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert RunDir(run_dir).lock_file.exists()  # left by the kill, and no obstacle
    lock = RunLock(run_dir)
    assert RunDir(run_dir).lock_file.read_text() == f"{os.getpid()}\n"
    with pytest.raises(UserError, match=rf"PID {os.getpid()}"):  # a second lock in one process too
        RunLock(run_dir)
    lock.release()
    assert not RunDir(run_dir).lock_file.exists() and run_dir.is_dir()  # it made nothing else, but found it


def test_a_lock_that_made_the_run_directory_removes_it_again_when_nothing_was_written(tmp_path):
    RunLock(tmp_path / "a" / "b" / "run").release()
    assert list(tmp_path.iterdir()) == []
    lock = RunLock(tmp_path / "run")
    (tmp_path / "run" / "config.yaml").write_text("steps: 1\n")
    lock.release()
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["config.yaml"]


def test_a_lock_whose_file_cannot_be_removed_is_given_up_all_the_same(tmp_path, monkeypatch, capsys):
    """A run directory made read-only mid-run (chattr +i): the lock file stays, with a warning, and
    the next run takes it over."""
    lock_file = RunDir(tmp_path / "run").lock_file
    lock = RunLock(tmp_path / "run")
    unlink = Path.unlink

    def refused(path, missing_ok=False):
        if path == lock_file:
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), str(path))
        unlink(path, missing_ok)

    monkeypatch.setattr(Path, "unlink", refused)
    lock.release()
    assert "could not remove the run directory's lock file" in capsys.readouterr().err
    monkeypatch.undo()
    assert lock_file.exists()
    RunLock(tmp_path / "run").release()
    assert not lock_file.exists()
