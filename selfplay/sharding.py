"""The learner's model sharded over a group of processes with FSDP2 (`fully_shard`).

Each decoder layer is one FSDP unit and the whole model (embeddings, final norm, output head)
the root unit: a process holds 1/N of every weight, gradient and AdamW moment, gathers a layer's
weights just before the layer runs and frees them after, and reduce-scatters its gradients in
the backward pass. Every process runs the same update on its share of the step's samples
(`Shards.share`), so gradients summed over the group are the gradients of the whole batch.

Two rules follow from gathering per forward pass, and the learner keeps both:
- every process makes the same forward calls, so a process with fewer micro-batches than
  another runs padding ones whose loss counts zero;
- a layer runs once per forward pass (`response_hidden(share_prefix=False)`): the prompt
  prefix that one process runs once and reuses would meet freed weights in the backward pass.

Scoring calls the decoder and the output head apart, not the model's `forward`, so the root
unit is told of the scoring function (`score_responses`) through FSDP's own
`register_fsdp_forward_method`: its weights are gathered around each call.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from selfplay.scoring import response_logprobs_and_entropy

# The largest weights file a sharded learner writes (Hugging Face's sharded safetensors layout):
# the first process holds one file's tensors at a time, never the whole model.
MAX_FILE_BYTES = 4 * 2**30


@dataclass(frozen=True)
class Shards:
    """Where this process sits in the learner's group: its rank of `processes`, and its device."""

    rank: int
    processes: int
    device: str

    def share(self, chunks: Sequence) -> list[tuple[object, bool]]:
        """This process's part of `chunks`, as (chunk, counts): every `processes`-th chunk from
        its rank, padded with a chunk that counts nothing up to the count every process runs."""
        mine = [(chunk, True) for chunk in chunks[self.rank :: self.processes]]
        runs = -(-len(chunks) // self.processes)
        return mine + [(chunks[0], False)] * (runs - len(mine))

    def sum(self, values: Sequence[float]) -> list[float]:
        """`values` summed over the group, element by element."""
        total = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(total)
        return total.tolist()

    def max(self, value: float) -> float:
        top = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        return top.item()

    def gather(self, value) -> list:
        """Every process's `value` (any picklable object), in rank order, its tensors on this
        process's device. Tensors travel on the CPU: unpickled as sent, another process's would
        land on that process's GPU, which this one may not see and cannot mix with its own."""
        values = [None] * self.processes
        dist.all_gather_object(values, placed(value, "cpu"))
        return [placed(part, self.device) for part in values]

    def from_first(self, value):
        """Rank 0's `value` on every process."""
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]


def placed(value, device: str):
    """`value` with every tensor in it, through nested dicts, lists and tuples, moved to `device`."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {key: placed(item, device) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(placed(item, device) for item in value)
    return value


def init_process_group(shards: Shards, address: str, port: int, timeout_minutes: float) -> None:
    """Join the learner's process group: gloo for CPU tensors (the statistics, and everything
    on a CPU learner), NCCL for GPU tensors."""
    import datetime

    backend = "cpu:gloo,cuda:nccl" if shards.device.startswith("cuda") else "gloo"
    if shards.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(shards.device))
    dist.init_process_group(
        backend,
        init_method=f"tcp://{address}:{port}",
        rank=shards.rank,
        world_size=shards.processes,
        timeout=datetime.timedelta(minutes=timeout_minutes),
    )


def shard_model(model: torch.nn.Module, shards: Shards, precision: str, offload: bool) -> torch.nn.Module:
    """`model` (a Hugging Face causal LM, on the CPU) sharded in place over the group, on
    `shards.device`; gradients are summed over the processes, not averaged (each process's
    loss already carries its share's weight in the whole batch)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        FSDPModule,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
        register_fsdp_forward_method,
    )

    device_type = torch.device(shards.device).type
    mesh = init_device_mesh(device_type, (shards.processes,))
    # bf16: compute in bf16, keep fp32 weights and reduce gradients in fp32.
    mixed = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    settings = {
        "mesh": mesh,
        "mp_policy": mixed if precision == "bf16" else MixedPrecisionPolicy(),
        "offload_policy": CPUOffloadPolicy() if offload else OffloadPolicy(),
    }
    layers = getattr(model.get_decoder(), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} keeps no decoder `layers` to shard one by one")
    for layer in layers:
        fully_shard(layer, **settings)
    fully_shard(model, **settings)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # gloo has no pre-scaled sum
    model.score_responses = functools.partial(_score_responses, model)
    register_fsdp_forward_method(model, "score_responses")
    return model


def _score_responses(model, *args, **kwargs):
    """`response_logprobs_and_entropy`, each layer run once, returning tensors of their own: FSDP
    hooks every output for the backward pass, and warns of views (a view changed in place would
    skip its hook)."""
    logprobs, entropies = response_logprobs_and_entropy(model, *args, share_prefix=False, **kwargs)
    return [t.clone() for t in logprobs], entropies and [t.clone() for t in entropies]


def full_tensors(model: torch.nn.Module, dtype: torch.dtype, skip: frozenset[str] = frozenset()) -> Iterator:
    """(name, whole tensor) of each weight of a sharded model but `skip`, one at a time: every
    process gathers each in turn (a collective), and no process holds more than one whole."""
    for name, tensor in model.state_dict().items():
        if name in skip:
            continue
        if isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()
        yield name, tensor.detach().to(dtype)


def save_streamed(weights: Iterator, sizes: dict[str, int], directory: Path | None) -> None:
    """Write the stream `weights` into `directory` as Hugging Face safetensors files of at most
    MAX_FILE_BYTES each (`model.safetensors`, or numbered files and their index), holding one
    file's tensors at a time. `sizes` gives each tensor's bytes up front, which names the files
    before the first tensor arrives. A process that writes nothing (`directory` None) still reads
    the stream: gathering each tensor takes every process."""
    from safetensors.torch import save_file

    files: list[list[str]] = [[]]
    filled = 0
    for name, size in sizes.items():
        if files[-1] and filled + size > MAX_FILE_BYTES:
            files.append([])
            filled = 0
        files[-1].append(name)
        filled += size
    names = (
        ["model.safetensors"]
        if len(files) == 1
        else [f"model-{i:05d}-of-{len(files):05d}.safetensors" for i in range(1, len(files) + 1)]
    )
    file_of = {name: file for file, members in zip(names, files) for name in members}
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
    pending: dict[str, torch.Tensor] = {}
    for name, tensor in weights:
        if directory is None:
            continue
        pending[name] = tensor.cpu().contiguous()
        file = file_of[name]
        if len(pending) == len(files[names.index(file)]):
            save_file(pending, str(directory / file), {"format": "pt"})
            pending = {}
    if directory is not None and len(names) > 1:
        index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": file_of}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))


def local_bytes(tensors) -> int:
    """The bytes this process holds of `tensors` (its shards of DTensors)."""
    return sum(
        (t.to_local() if isinstance(t, DTensor) else t).numel() * t.element_size() for t in tensors if t is not None
    )


def threads_per_process(processes: int) -> int:
    """CPU threads for each of `processes` learner processes on this machine: its cores shared out."""
    return max(1, (os.cpu_count() or 1) // processes)
