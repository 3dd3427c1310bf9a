"""Checkpoints of a training run, written atomically and read without unpickling anything.

A checkpoint is `RUN_DIR/checkpoints/step-NNNNNN/`: a Hugging Face model directory of the
policy (`AutoModelForCausalLM.from_pretrained` loads it) plus

- `optimizer.safetensors` and `optimizer.json`: the optimizer's tensors and its settings;
- `rng.safetensors`: torch's random-number-generator states;
- `reference.safetensors`: the KL reference, when `learner.reference_update_every` has moved it
  away from the initial policy;
- `trainer_state.json`: the step, the advantage baselines, and whatever else the trainer and
  league keep.

It is written to a hidden scratch directory and renamed into place, so a crash mid-write
leaves the previous checkpoint as the latest complete one.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from selfplay.errors import UserError

STATE_FILE = "trainer_state.json"
REFERENCE_FILE = "reference.safetensors"
PREFIX = "step-"


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(run_dir: str | Path, step: int, learner, state: dict, keep: int = 2) -> Path:
    """Write the checkpoint of `step` and delete all but the newest `keep`."""
    root = checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:06d}"
    scratch = root / f".{final.name}.partial"
    shutil.rmtree(scratch, ignore_errors=True)
    learner.save_pretrained(scratch)
    tensors, settings = _flatten_optimizer(learner.optimizer.state_dict())
    save_file(tensors, str(scratch / "optimizer.safetensors"))
    (scratch / "optimizer.json").write_text(json.dumps(settings))
    save_file(_rng_states(), str(scratch / "rng.safetensors"))
    if learner.reference_moved:
        learner.save_reference(scratch / REFERENCE_FILE)
    (scratch / STATE_FILE).write_text(json.dumps({"step": step, **state}, indent=1))
    _fsync_tree(scratch)
    if final.exists():  # a re-run of a step after a resume
        shutil.rmtree(final)
    scratch.rename(final)
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of the run, oldest first."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.startswith(PREFIX) and (p / STATE_FILE).exists()]
    return sorted(found, key=lambda p: int(p.name.removeprefix(PREFIX)))


def latest_checkpoint(run_dir: str | Path) -> Path:
    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        raise UserError(
            f"No checkpoint in '{checkpoints_dir(run_dir)}' to resume from. Start the run without --resume, "
            "or point --resume at the run directory that holds the checkpoints."
        )
    return checkpoints[-1]


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint was written at, read from its trainer state."""
    try:
        return int(json.loads((Path(path) / STATE_FILE).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UserError(f"Checkpoint '{path}' has an unreadable {STATE_FILE} ({err}); it may be corrupt.") from None


def load_checkpoint(path: Path, learner) -> dict:
    """Restore the optimizer and random states into `learner` and the process; returns the
    trainer state. (The policy weights are loaded when the learner is built from `path`.)"""
    try:
        state = json.loads((path / STATE_FILE).read_text())
        settings = json.loads((path / "optimizer.json").read_text())
        tensors = load_file(str(path / "optimizer.safetensors"))
        rng = load_file(str(path / "rng.safetensors"))
        learner.optimizer.load_state_dict(_unflatten_optimizer(tensors, settings))
        if (path / REFERENCE_FILE).exists():
            learner.load_reference(path / REFERENCE_FILE)
    except (OSError, ValueError, KeyError) as err:
        raise UserError(
            f"Checkpoint '{path}' is damaged ({err}). Delete that directory to resume from the one before it."
        ) from None
    torch.set_rng_state(rng["torch"])
    if torch.cuda.is_available():
        torch.cuda.set_rng_state_all([rng[f"cuda.{i}"] for i in range(torch.cuda.device_count())])
    return state


def _rng_states() -> dict[str, torch.Tensor]:
    states = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states.update({f"cuda.{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    return states


def _flatten_optimizer(state_dict: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """A torch optimizer's state as named tensors plus JSON (its numbers and settings)."""
    tensors, scalars = {}, {}
    for index, values in state_dict["state"].items():
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{index}.{name}"] = value.detach().contiguous().cpu()
            else:
                scalars[f"{index}.{name}"] = value
    return tensors, {"param_groups": state_dict["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], settings: dict) -> dict:
    state: dict[int, dict] = {}
    for key, value in [*tensors.items(), *settings["scalars"].items()]:
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    return {"state": state, "param_groups": settings["param_groups"]}


def _fsync_tree(directory: Path) -> None:
    """Flush every file to disk before the rename publishes the checkpoint."""
    for path in directory.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
