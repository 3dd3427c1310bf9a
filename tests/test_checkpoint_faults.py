"""Checkpoints under faults, without training: each layout verified against the manifest written
with it, the checkpoints `keep_checkpoints` drops deleted before a save needs the room, and a
sharded (torch.distributed.checkpoint) write that fails reported as any failed write is."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch.distributed.checkpoint.api import CheckpointException

from selfplay import training_state
from selfplay.checkpoint import MANIFEST, checkpoint_problem, latest_checkpoint, list_checkpoints, save_checkpoint
from selfplay.errors import UserError
from selfplay.files import WriteError
from selfplay.reference_cache import ReferenceCache
from selfplay.run_dir import RunDir

# The sharded layout written by one process, as these tests do, makes DCP say so.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
DISK_FULL = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class ShardedLearner:
    """Writes what a sharded learner writes: a model directory, and its training state as a
    torch.distributed.checkpoint directory, here from one process. `before_writing` runs first."""

    shards = "two processes"  # any value but None: the sharded layout
    reference_moved = False
    reference_cache = ReferenceCache()

    def __init__(self, before_writing=lambda directory: None):
        self.model = torch.nn.Linear(4, 4)
        self.optimizer = torch.optim.AdamW(self.model.parameters())
        self.model(torch.ones(1, 4)).sum().backward()
        self.optimizer.step()
        self.before_writing = before_writing

    def save_pretrained(self, directory: Path) -> None:
        self.before_writing(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text("{}")
        save_file({name: p.detach() for name, p in self.model.named_parameters()}, str(directory / "model.safetensors"))

    def save_training_state(self, directory: Path) -> None:
        training_state.save(self, directory)


def save(run_dir: Path, step: int, learner=None, keep: int = 5) -> Path:
    return save_checkpoint(run_dir, step, learner or ShardedLearner(), {"baselines": []}, keep=keep)


def names(run_dir: Path) -> list[str]:
    return [path.name for path in list_checkpoints(run_dir)]


def test_a_sharded_checkpoint_records_every_file_and_is_whole(tmp_path):
    saved = save(tmp_path, 1)
    recorded = json.loads((saved / MANIFEST).read_text())["files"]
    shards = sorted(name for name in recorded if name.startswith("training_state/"))
    assert shards == ["training_state/.metadata", "training_state/__0_0.distcp"]
    assert recorded["model.safetensors"]["bytes"] == (saved / "model.safetensors").stat().st_size
    assert checkpoint_problem(saved) is None


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda file: file.write_bytes(file.read_bytes()[:-7]), "holds {cut:,} bytes, not the {whole:,} written"),
        (
            lambda file: file.write_bytes(bytes(b ^ 1 for b in file.read_bytes())),
            "is changed since it was written (its SHA-256 differs)",
        ),
        (lambda file: file.unlink(), "is missing"),
    ],
    ids=["cut", "changed", "missing"],
)
def test_a_damaged_shard_makes_resume_fall_back_to_the_previous_whole_checkpoint(tmp_path, capsys, damage, problem):
    save(tmp_path, 1)
    last = save(tmp_path, 2)
    shard = last / "training_state" / "__0_0.distcp"
    whole = shard.stat().st_size
    damage(shard)
    expected = problem.format(cut=whole - 7, whole=whole)
    assert checkpoint_problem(last) == f"training_state/__0_0.distcp {expected}"
    assert latest_checkpoint(tmp_path).name == "step-000001"
    assert f"checkpoint '{last}' is damaged (training_state/__0_0.distcp {expected})" in capsys.readouterr().err


def test_a_file_the_checkpoint_did_not_write_makes_it_damaged(tmp_path):
    saved = save(tmp_path, 1)
    (saved / "adapter_config.json").write_text("{}")  # would make a loader take the model for a LoRA adapter
    assert checkpoint_problem(saved) == "adapter_config.json is not one of its files (delete it)"


def test_a_sharded_write_onto_a_full_disk_is_one_message_and_leaves_nothing(tmp_path, monkeypatch):
    save(tmp_path, 1)
    write = torch.save

    def disk_fills_up(tensor, stream, *args, **kwargs):  # what torch.distributed.checkpoint writes each shard with
        write(tensor, stream, *args, **kwargs)
        raise DISK_FULL

    monkeypatch.setattr(torch, "save", disk_fills_up)
    with pytest.raises(WriteError, match=r"Could not write the checkpoint .*step-000002': No space left on device"):
        save(tmp_path, 2)
    assert sorted(path.name for path in RunDir(tmp_path).checkpoints.iterdir()) == ["step-000001"]


def test_a_sharded_write_failure_is_the_processes_failed_write_whichever_process_met_it():
    short = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    met_by_both = CheckpointException("write", {0: (short, None), 1: (DISK_FULL, None)})
    assert training_state._write_error(met_by_both) is DISK_FULL
    only_short = training_state._write_error(CheckpointException("write", {1: (short, None)}))
    assert isinstance(only_short, OSError) and "written short" in only_short.strerror
    bug = CheckpointException("write", {0: (KeyError("optimizer"), None)})
    assert training_state._write_error(bug) is bug  # not a write failure: kept as raised, with its traceback


def disk_holding(run_dir: Path, checkpoints: int):
    """A disk with room for `checkpoints` checkpoints of `run_dir`: a write beyond them fails as
    a full disk does."""

    def before_writing(directory: Path) -> None:
        if len(list_checkpoints(run_dir)) >= checkpoints:
            raise DISK_FULL

    return before_writing


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_the_checkpoints_keep_drops_are_deleted_before_the_new_one_is_written(tmp_path, keep):
    for step in (1, 2, 3):
        save(tmp_path, step)
    during_the_write = []
    learner = ShardedLearner(lambda directory: during_the_write.extend(names(tmp_path)))
    save(tmp_path, 4, learner, keep=keep)
    # Never fewer than one whole checkpoint: with keep=1, step 3 stays until step 4 is in place.
    assert during_the_write == [f"step-{step:06d}" for step in range(min(5 - keep, 3), 4)]
    assert names(tmp_path) == [f"step-{step:06d}" for step in range(5 - keep, 5)]


def test_the_newest_whole_checkpoint_is_kept_through_the_write_however_many_are_dropped(tmp_path):
    for step in (1, 2, 3):
        save(tmp_path, step)
    damaged = RunDir(tmp_path).checkpoints / "step-000003" / "model.safetensors"
    damaged.write_bytes(damaged.read_bytes()[:-3])
    during_the_write = []
    save(tmp_path, 4, ShardedLearner(lambda directory: during_the_write.extend(names(tmp_path))), keep=1)
    assert during_the_write == ["step-000002"]
    assert names(tmp_path) == ["step-000004"]


def test_lowering_keep_checkpoints_makes_room_for_the_next_save(tmp_path):
    """What a run stopped by a full disk says to do: keep_checkpoints lowered, the save fits."""
    for step in (1, 2, 3):
        save(tmp_path, step)
    with pytest.raises(WriteError, match="No space left on device"):
        save(tmp_path, 4, ShardedLearner(disk_holding(tmp_path, 3)), keep=4)
    assert names(tmp_path) == ["step-000001", "step-000002", "step-000003"]
    save(tmp_path, 4, ShardedLearner(disk_holding(tmp_path, 3)), keep=3)
    assert names(tmp_path) == ["step-000002", "step-000003", "step-000004"]


def test_a_manifest_that_is_not_one_is_a_damaged_checkpoint(tmp_path):
    saved = save(tmp_path, 1)
    (saved / MANIFEST).write_text("[]")
    assert checkpoint_problem(saved).startswith(f"{MANIFEST} is unreadable")
    with pytest.raises(UserError, match="Every checkpoint .* is damaged"):
        latest_checkpoint(tmp_path)


def test_a_checkpoint_written_before_manifests_gets_the_checks_that_need_none(tmp_path):
    saved = save(tmp_path, 1)
    (saved / MANIFEST).unlink()
    assert checkpoint_problem(saved) is None
    model = saved / "model.safetensors"
    model.write_bytes(model.read_bytes()[:-3])
    assert "model.safetensors is unreadable" in checkpoint_problem(saved)
