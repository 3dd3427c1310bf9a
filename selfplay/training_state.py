"""A learner's training state beside its policy weights in a checkpoint: the optimizer's state,
the KL reference once `learner.reference_update_every` has moved it off the initial policy (a
LoRA learner's: its reference adapter), the reference's cached log-probabilities
(`selfplay.reference_cache`, one file in either layout: every process holds the same cache), and
the weights an exploiter keeps (`Learner.keep_weights`; exploiters are never sharded).

Two layouts, each readable by a learner of any process count:
- a learner of one process writes files: `optimizer.safetensors` (the moments, by the index of
  each trainable weight), `optimizer.json` (settings and scalars), `reference.safetensors` and
  `kept.safetensors`;
- a sharded learner writes one `torch.distributed.checkpoint` directory, `training_state/`, to
  which each process writes its own shards in parallel, and which loads resharded onto any
  number of processes (one included).
"""

from __future__ import annotations

import errno
import json
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, load_model, save_file, save_model
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from selfplay.files import WRITE_FAILURES, is_disk_full

OPTIMIZER_FILE, OPTIMIZER_SETTINGS, REFERENCE_FILE = "optimizer.safetensors", "optimizer.json", "reference.safetensors"
KEPT_FILE = "kept.safetensors"
SHARDED_DIR = "training_state"
# What each layout must hold to be whole.
FILES_LAYOUT = (OPTIMIZER_FILE, OPTIMIZER_SETTINGS)
SHARDED_LAYOUT = (f"{SHARDED_DIR}/.metadata",)


def save(learner, directory: Path) -> None:
    if len(learner.reference_cache) and (learner.shards is None or learner.shards.rank == 0):
        learner.reference_cache.save(directory)
    if learner.shards is None:
        tensors, settings = _flatten_optimizer(learner.optimizer.state_dict())
        save_file(tensors, str(directory / OPTIMIZER_FILE))
        (directory / OPTIMIZER_SETTINGS).write_text(json.dumps(settings))
        if learner.reference_moved and learner.reference_adapter:
            save_file(learner.reference_adapter_state(), str(directory / REFERENCE_FILE))
        elif learner.reference_moved:
            save_model(learner.reference, str(directory / REFERENCE_FILE))
        if learner.kept is not None:
            kept = {name: tensor.cpu().contiguous() for name, tensor in learner.kept.items()}
            save_file(kept, str(directory / KEPT_FILE))
        return
    state = {"optimizer": get_optimizer_state_dict(learner.model, learner.optimizer)}
    if learner.reference_moved:
        state["reference"] = get_model_state_dict(learner.reference)
    try:
        dcp.save(state, checkpoint_id=directory / SHARDED_DIR)
    except CheckpointException as failed:
        raise _write_error(failed) from None


def _write_error(failed: CheckpointException) -> BaseException:
    """What a sharded save that failed raises: a process's failed write (a full disk first) as
    the OSError it was, which every process then meets and the checkpoint reports as any failed
    write; anything else as DCP raised it. torch's writer reports a file written short (what a
    full disk does to it) as a RuntimeError saying "unexpected pos"."""
    errors = [error for _, (error, _trace) in sorted(failed.failures.items())]
    written = [error for error in errors if isinstance(error, WRITE_FAILURES)]
    if written:
        return next((error for error in written if is_disk_full(error)), written[0])
    short = [error for error in errors if isinstance(error, RuntimeError) and "unexpected pos" in str(error)]
    if short:
        return OSError(errno.EIO, f"a file of the sharded training state was written short ({short[0]})")
    return failed


def load(learner, directory: Path) -> None:
    """Restore the state `save` wrote in `directory`, in either layout."""
    learner.reference_cache.load(directory)
    if (directory / SHARDED_DIR).is_dir():
        _load_sharded(learner, directory / SHARDED_DIR)
    elif learner.shards is None:
        learner.optimizer.load_state_dict(_read_optimizer(directory))
        if (directory / REFERENCE_FILE).exists() and learner.reference_adapter:
            learner.load_reference_adapter(load_file(str(directory / REFERENCE_FILE)))
        elif (directory / REFERENCE_FILE).exists():
            missing, unexpected = load_model(learner.reference, str(directory / REFERENCE_FILE), strict=False)
            if missing or unexpected:
                raise ValueError(f"reference weights do not fit the model: missing {missing}, unexpected {unexpected}")
            learner.reference_moved = True
        if (directory / KEPT_FILE).exists():
            learner.kept = {name: t.to(learner.device) for name, t in load_file(str(directory / KEPT_FILE)).items()}
    else:  # one process's files, shared out over the group: each process reads them whole
        by_index = _read_optimizer(directory)
        names = [name for name, p in learner.model.named_parameters() if p.requires_grad]
        whole = {
            "state": {names[index]: values for index, values in by_index["state"].items()},
            "param_groups": [
                {**group, "params": [names[i] for i in group["params"]]} for group in by_index["param_groups"]
            ],
        }
        options = StateDictOptions(full_state_dict=True)
        set_optimizer_state_dict(learner.model, learner.optimizer, whole, options=options)
        if (directory / REFERENCE_FILE).exists():
            set_model_state_dict(learner.reference, load_file(str(directory / REFERENCE_FILE)), options=options)
            learner.reference_moved = True


def _load_sharded(learner, path: Path) -> None:
    saved = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    state = {"optimizer": get_optimizer_state_dict(learner.model, learner.optimizer)}
    moved = any(key.startswith("reference.") for key in saved)
    if moved:
        state["reference"] = get_model_state_dict(learner.reference)
    with warnings.catch_warnings():  # a learner of one process loads without a group, as it means to
        warnings.filterwarnings("ignore", "torch.distributed is disabled")
        dcp.load(state, checkpoint_id=path, no_dist=not dist.is_initialized())
    set_optimizer_state_dict(learner.model, learner.optimizer, state["optimizer"])
    if moved:
        set_model_state_dict(learner.reference, state["reference"])
        learner.reference_moved = True


def _read_optimizer(directory: Path) -> dict:
    settings = json.loads((directory / OPTIMIZER_SETTINGS).read_text())
    return _unflatten_optimizer(load_file(str(directory / OPTIMIZER_FILE)), settings)


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
