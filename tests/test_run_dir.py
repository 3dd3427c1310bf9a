"""The run directory's layout, which runs written by earlier versions of selfplay keep."""

from __future__ import annotations

from pathlib import Path

import pytest

from selfplay.errors import UserError
from selfplay.run_dir import RunDir


def test_the_layout_of_a_run_directory():
    run = RunDir("runs/a")
    assert run.config == Path("runs/a/config.yaml")
    assert run.checkpoints == Path("runs/a/checkpoints")
    assert run.league_store == Path("runs/a/league.sqlite")
    assert run.snapshot("main@000004") == Path("runs/a/league/snapshots/main@000004.safetensors")
    assert run.sync("main_exploiter_0") == Path("runs/a/sync/main_exploiter_0.safetensors")
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
