"""A command stopped by SIGINT or SIGTERM: one line, no traceback, the shell's exit code for the
signal, and nothing half-written."""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from selfplay import cli
from selfplay.cli import main


def test_sigterm_stops_a_command_as_ctrl_c_does_with_exit_code_143(monkeypatch, capsys):
    def terminated(args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises first
        raise AssertionError("SIGTERM did not stop the command")

    monkeypatch.setattr(cli, "_cmd_games_list", terminated)
    before = signal.getsignal(signal.SIGTERM)  # a test session may hold its own handler
    assert main(["games", "list"]) == 143
    assert capsys.readouterr().err == "selfplay: stopped by SIGTERM\n"
    assert signal.getsignal(signal.SIGTERM) == before  # given back as it was


def stop_midway(args: list[str], started: Callable[[], bool], signum: int) -> tuple[int, str]:
    """Run `selfplay ARGS` in a process of its own, send it `signum` once `started()` holds, and
    give back its exit code and what it wrote to stderr."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "selfplay.cli", *args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while not started():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.1)
    process.send_signal(signum)
    _, err = process.communicate(timeout=60)
    return process.returncode, err


def written_games(path: Path) -> int:
    """Whole lines in a transcripts file being written (its partial file)."""
    partial = path.with_name(path.name + ".partial")
    return partial.read_text().count("\n") if partial.exists() else 0


@pytest.mark.slow
def test_ctrl_c_in_play_says_how_many_games_were_played_and_writes_no_transcripts(tiny_model_dir, tmp_path):
    path = tmp_path / "games.jsonl"
    args = ["play", "kuhn_poker", "--agents", f"model:{tiny_model_dir},random", "--episodes", "100000"]
    code, err = stop_midway(
        [*args, "--max-new-tokens", "8", "--no-progress", "--transcripts", str(path)],
        lambda: written_games(path) >= 1,
        signal.SIGINT,
    )
    assert code == 130 and "Traceback" not in err
    (line,) = err.splitlines()
    assert line.startswith("selfplay: interrupted: play stopped after ")
    assert line.endswith(f" of 100000 games; {path} was not written.")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_sigterm_in_eval_says_what_it_finished_and_writes_nothing(tiny_model_dir, tmp_path):
    out, path = tmp_path / "eval", tmp_path / "games.jsonl"
    args = ["eval", "--checkpoints", str(tiny_model_dir), "--games", "kuhn_poker", "--episodes", "100000"]
    code, err = stop_midway(
        [*args, "--max-new-tokens", "8", "--out", str(out), "--no-progress", "--transcripts", str(path)],
        lambda: written_games(path) >= 1,
        signal.SIGTERM,
    )
    assert code == 143 and "Traceback" not in err
    line = err.splitlines()[-1]
    assert line.startswith("selfplay: stopped by SIGTERM: the evaluation stopped after ")
    assert line.endswith(
        " of 100000 games. It wrote nothing: an unfinished evaluation has no report; run it again for one."
    )
    assert list(out.iterdir()) == [] and not path.exists() and not path.with_name("games.jsonl.partial").exists()
