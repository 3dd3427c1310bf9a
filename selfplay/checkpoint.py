"""Checkpoints of a training run, written atomically and read without unpickling anything.

A checkpoint is `RUN_DIR/checkpoints/step-NNNNNN/`: a Hugging Face model directory of the
policy (`AutoModelForCausalLM.from_pretrained` loads it; a sharded learner's weights over
several files for a large model) plus

- the optimizer's state, and the KL reference when `learner.reference_update_every` has moved it
  away from the initial policy: files from a learner of one process, a sharded
  `torch.distributed.checkpoint` directory from a sharded one, each resumable by a learner of
  any process count (`selfplay.training_state`);
- `rng.safetensors`: torch's random-number-generator states;
- `trainer_state.json`: the step, the advantage baselines, and whatever else the trainer and
  league keep;
- `exploiters/NAME/`: the same for each of a league's exploiters (a LoRA learner's adapter in
  `adapter/`), so that the step of every learning player is saved, kept and deleted as one.

A run that trains one adapter per role (`learner.adapter_per_role`) has no one policy to write:
its checkpoint holds, in place of the model directory and the training state, `adapters/ROLE/`
for each role, that role's adapter (`adapter/`, peft's format, over the run's initial model)
and its optimizer's state.

It is written to a hidden scratch directory and renamed into place, so a crash mid-write
leaves the previous checkpoint as the latest complete one; a write that fails (a full disk)
removes the scratch directory. The checkpoints that `keep` drops are deleted before the new one
is written, all but the newest whole one, which goes once the new one is in place: a save needs
room for `keep` checkpoints (two at least), not one more. An old checkpoint is renamed to a
hidden name before it is deleted, so a crash mid-delete leaves nothing that looks like a
checkpoint. The next save removes the leftovers of either.

`manifest.json`, written last, records the size and SHA-256 of every other file, whatever the
layout (one file or sharded, exploiters included). A checkpoint with a file missing, cut short,
changed or not recorded is damaged: resuming passes over it, with a warning, to the newest whole
one before it. (Checkpoints written before manifests get the checks that need none: every file
of its layout present, and each JSON and safetensors file readable whole.)
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from selfplay.errors import UserError
from selfplay.files import WRITE_FAILURES, WriteError, file_sha256, set_file_permissions_from_directory, write_failure
from selfplay.run_dir import ADAPTER_CONFIG, RunDir
from selfplay.training_state import FILES_LAYOUT, SHARDED_LAYOUT

STATE_FILE = "trainer_state.json"
MANIFEST = "manifest.json"
EXPLOITERS_DIR = "exploiters"
ROLE_ADAPTERS_DIR = "adapters"
ADAPTER_DIR = "adapter"  # a LoRA learner's adapter, in its part of a checkpoint
PREFIX = "step-"
# Hidden names of a checkpoint being written and of one being deleted.
PARTIAL, DELETING = ".partial", ".deleting"
# What every learning player's part of a checkpoint holds: each tuple is a layout, one of which it
# must hold in full (weights in one file or indexed files; training state as files or sharded).
REQUIRED_FILES = (
    ((STATE_FILE,),),
    (("config.json",),),
    (("model.safetensors",), ("model.safetensors.index.json",)),
    (FILES_LAYOUT, SHARDED_LAYOUT),
    (("rng.safetensors",),),
)
# What a checkpoint of one adapter per role holds: the trainer's part, and each role's.
ROLE_CHECKPOINT_FILES = (((STATE_FILE,),), (("rng.safetensors",),))
ROLE_ADAPTER_FILES = (
    ((f"{ADAPTER_DIR}/{ADAPTER_CONFIG}", f"{ADAPTER_DIR}/adapter_model.safetensors"),),
    (FILES_LAYOUT,),
)
# What a file that cannot be read raises: safetensors reports a cut-short file as SafetensorError.
READ_ERRORS = (OSError, ValueError, KeyError, TypeError, SafetensorError)


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    learner,
    state: dict,
    keep: int = 2,
    exploiters: Mapping[str, tuple] = MappingProxyType({}),
) -> Path:
    """Write the checkpoint of `step`: `learner` and the trainer `state`, and each exploiter's
    (learner, state) by name, keeping the newest `keep` (all with 0). A write that fails raises
    WriteError, and leaves the newest whole checkpoint before it and all that `keep` keeps."""
    root = RunDir(run_dir).checkpoints
    root.mkdir(parents=True, exist_ok=True)
    for leftover in root.glob(f".{PREFIX}*"):  # of a save or a deletion that a crash cut short
        if leftover.name.endswith((PARTIAL, DELETING)):
            shutil.rmtree(leftover, ignore_errors=True)
    _prune_before_saving(run_dir, step, keep)
    final = root / f"{PREFIX}{step:06d}"
    scratch = root / f".{final.name}{PARTIAL}"
    try:
        for name, (exploiter, exploiter_state) in exploiters.items():
            _write(scratch / EXPLOITERS_DIR / name, step, exploiter, exploiter_state)
        _write(scratch, step, learner, state)
        set_file_permissions_from_directory(scratch)
        _write_manifest(scratch)
    except (*WRITE_FAILURES, WriteError) as err:
        shutil.rmtree(scratch, ignore_errors=True)
        raise write_failure("the checkpoint", final, err) from None
    if final.exists():  # a re-run of a step after a resume
        _discard(final)
    scratch.rename(final)
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        _discard(old)
    return final


def _prune_before_saving(run_dir: str | Path, step: int, keep: int) -> None:
    """Delete the checkpoints before `step` that will not be among the newest `keep` once it is
    saved, but the newest whole one: until the new checkpoint is in place, it is the one to
    resume from. (Whole by its files' sizes: its digests were checked when it was written or
    resumed from.)"""
    earlier = [path for path in list_checkpoints(run_dir) if _named_step(path) < step]
    dropped = earlier[: max(len(earlier) - (keep - 1), 0)] if keep > 0 else []
    if not dropped:
        return
    newest_whole = next((path for path in reversed(earlier) if checkpoint_problem(path, digests=False) is None), None)
    for old in dropped:
        if old != newest_whole:
            _discard(old)


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """The run's checkpoints, oldest first, damaged ones included (see `checkpoint_problem`)."""
    root = RunDir(run_dir).checkpoints
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _named_step(p) is not None and (p / STATE_FILE).exists()]
    return sorted(found, key=_named_step)


def latest_checkpoint(run_dir: str | Path) -> Path:
    """The run's newest whole checkpoint. Newer damaged ones are passed over, each named in a
    warning; one whose saved step is not its name's is refused."""
    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        raise UserError(
            f"No checkpoint in '{RunDir(run_dir).checkpoints}' to resume from. Start the run without --resume, "
            "or point --resume at the run directory that holds the checkpoints."
        )
    for path in reversed(checkpoints):
        problem = checkpoint_problem(path)
        if problem is None:
            checkpoint_step(path)  # refuses a copied or renamed checkpoint
            return path
        print(
            f"warning: checkpoint '{path}' is damaged ({problem}); using the newest whole checkpoint before it. "
            "A resumed run replaces it when it saves that step again.",
            file=sys.stderr,
        )
    raise UserError(
        f"Every checkpoint in '{RunDir(run_dir).checkpoints}' is damaged (see the warnings above). Restore one from "
        "a copy, or start a new run."
    )


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint was written at, read from its trainer state. A `step-N` directory
    whose state says another step (a copied or renamed checkpoint) raises UserError: resuming
    from it would rewind the run and overwrite later checkpoints."""
    try:
        step = _saved_step(path)
    except READ_ERRORS as err:
        raise UserError(f"Checkpoint '{path}' has an unreadable {STATE_FILE} ({err}); it may be corrupt.") from None
    named = _named_step(Path(path))
    if named is not None and named != step:
        raise UserError(
            f"Checkpoint '{path}' holds step {step}, not the step {named} its name says: it was copied or "
            f"renamed. Rename it to {PREFIX}{step:06d}, or move it out of '{Path(path).parent}'."
        )
    return step


def checkpoint_problem(path: Path, digests: bool = True) -> str | None:
    """What makes the checkpoint at `path` unloadable (a file missing, cut short, changed or
    unreadable, in its own part or an exploiter's, or one its manifest does not record), or None
    when it is whole. Without `digests`, its files' contents are not hashed (their sizes still
    count)."""
    path = Path(path)
    exploiters = path / EXPLOITERS_DIR
    roles = role_adapters(path)
    parts = [(path, ROLE_CHECKPOINT_FILES if roles else REQUIRED_FILES)]
    parts += [(part, REQUIRED_FILES) for part in (sorted(exploiters.iterdir()) if exploiters.is_dir() else [])]
    parts += [(role_adapter_part(path, role), ROLE_ADAPTER_FILES) for role in roles]
    for part, required in parts:
        for layouts in required:
            if not any(all((part / name).is_file() for name in layout) for layout in layouts):
                missing = next(name for name in layouts[0] if not (part / name).is_file())
                return f"{(part / missing).relative_to(path)} is missing"
    for file in sorted(path.rglob("*")):
        try:
            if file.suffix == ".json":
                json.loads(file.read_text())
            elif file.suffix == ".safetensors":
                with safe_open(str(file), framework="pt"):  # checks the file holds every tensor its header lists
                    pass
        except READ_ERRORS as err:
            return f"{file.relative_to(path)} is unreadable: {err}"
    try:
        _saved_step(path)
    except READ_ERRORS as err:
        return f"{STATE_FILE} holds no step: {err!r}"
    if not (path / MANIFEST).is_file():
        return None
    try:
        return _unlike_manifest(path, digests)
    except READ_ERRORS as err:
        return f"{MANIFEST} is unreadable: {err!r}"


def exploiter_checkpoint(checkpoint: Path, name: str) -> Path:
    """The part of `checkpoint` that holds the exploiter `name`."""
    path = Path(checkpoint) / EXPLOITERS_DIR / name
    if not path.is_dir():
        raise UserError(
            f"Checkpoint '{checkpoint}' holds no state of the league's exploiter '{name}' ({path} is missing), so "
            "the league cannot resume from it. Start a new run."
        )
    return path


def role_adapters(checkpoint: Path) -> list[str]:
    """The roles of a checkpoint of one adapter per role, sorted; none for any other checkpoint."""
    parts = Path(checkpoint) / ROLE_ADAPTERS_DIR
    return sorted(part.name for part in parts.iterdir() if part.is_dir()) if parts.is_dir() else []


def role_adapter_part(checkpoint: Path, role: str) -> Path:
    """The part of `checkpoint` that holds the adapter of `role` and its training state."""
    return Path(checkpoint) / ROLE_ADAPTERS_DIR / role


def load_checkpoint(path: Path, learner) -> dict:
    """Restore the optimizer and random states into `learner` and the process; returns the
    trainer state. (The policy weights are loaded when the learner is built from `path`.)"""
    try:
        state = json.loads((path / STATE_FILE).read_text())
        rng = load_file(str(path / "rng.safetensors"))
        learner.load_training_state(path)
    except READ_ERRORS as err:
        raise UserError(
            f"Checkpoint '{path}' is damaged ({err}). Move it out of its checkpoints directory to resume from the "
            "one before it."
        ) from None
    torch.set_rng_state(rng["torch"])
    if torch.cuda.is_available():
        torch.cuda.set_rng_state_all([rng[f"cuda.{i}"] for i in range(torch.cuda.device_count())])
    return state


def _write(directory: Path, step: int, learner, state: dict) -> None:
    """One learning player's part of a checkpoint; its trainer state last."""
    learner.save_pretrained(directory)
    learner.save_training_state(directory)
    save_file(_rng_states(), str(directory / "rng.safetensors"))
    (directory / STATE_FILE).write_text(json.dumps({"step": step, **state}, indent=1))


def _write_manifest(directory: Path) -> None:
    """Record every file of the checkpoint in `directory`, flushed to disk before the rename
    publishes it: its size and SHA-256, read back in a stream (the pages just written)."""
    files = {}
    for file in sorted(p for p in directory.rglob("*") if p.is_file()):
        with open(file, "rb") as stream:
            os.fsync(stream.fileno())
        files[file.relative_to(directory).as_posix()] = {"bytes": file.stat().st_size, "sha256": file_sha256(file)}
    with open(directory / MANIFEST, "w") as stream:
        json.dump({"files": files}, stream, indent=1)
        stream.flush()
        os.fsync(stream.fileno())


def _unlike_manifest(path: Path, digests: bool) -> str | None:
    """The first way the files of the checkpoint at `path` differ from its manifest: one
    missing, cut short or grown, changed (with `digests`), or not recorded (a loader reads
    some files by their presence: `adapter_config.json` makes a directory a LoRA adapter)."""
    recorded = json.loads((path / MANIFEST).read_text())["files"]
    present = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()} - {MANIFEST}
    unrecorded = sorted(present - recorded.keys())
    if unrecorded:
        return f"{unrecorded[0]} is not one of its files (delete it)"
    for name, record in recorded.items():
        if name not in present:
            return f"{name} is missing"
        size = (path / name).stat().st_size
        if size != record["bytes"]:
            return f"{name} holds {size:,} bytes, not the {record['bytes']:,} written"
        if digests and file_sha256(path / name) != record["sha256"]:
            return f"{name} is changed since it was written (its SHA-256 differs)"
    return None


def _discard(checkpoint: Path) -> None:
    """Delete a checkpoint, renaming it first: a crash midway leaves a hidden leftover, not a
    directory that looks like a checkpoint."""
    doomed = checkpoint.with_name(f".{checkpoint.name}{DELETING}")
    checkpoint.rename(doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _saved_step(path: Path) -> int:
    return int(json.loads((Path(path) / STATE_FILE).read_text())["step"])


def _named_step(path: Path) -> int | None:
    """The step a `step-N` directory's name says; None for any other name."""
    digits = path.name.removeprefix(PREFIX)
    return int(digits) if path.name.startswith(PREFIX) and digits.isdigit() else None


def _rng_states() -> dict[str, torch.Tensor]:
    states = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states.update({f"cuda.{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    return states
