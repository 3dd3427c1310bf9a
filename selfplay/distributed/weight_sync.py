"""How a learner's new weights reach the rollout workers after each update.

- Object store (`put_weights`): the weights as safetensors bytes, put into Ray's object
  store once per update; every worker on a node reads the same shared-memory copy. Simple,
  and it keeps every version a pending game may still need, so a restarted worker can replay
  its games with the weights they were first played with.
- Collective (`CollectiveSync`): one broadcast from the trainer over a process group of the
  trainer and the workers: gloo on CPU, NCCL on GPUs, where the bytes never touch the host.
  The group is built on a TCP store the trainer hosts, not with `ray.util.collective`, which
  refuses the driver process and fixes one group per process for good, so a restarted worker
  could never rejoin; a new group (under a new key prefix) is built whenever a worker joins.

Either way a worker writes the weights to a local file and loads it with the backend's own
`load_weights`, which for vLLM also resets the prefix cache.
"""

from __future__ import annotations

import datetime
import shutil
from pathlib import Path

import ray
import torch
import torch.distributed as dist
from safetensors.torch import save

from selfplay.backends import save_weights
from selfplay.files import published

GROUP_TIMEOUT = datetime.timedelta(minutes=5)
Manifest = list[tuple[str, tuple[int, ...]]]  # each tensor's name and shape, in broadcast order


def weights_bytes(weights: dict[str, torch.Tensor]) -> bytes:
    """`weights` as the safetensors bytes a worker loads."""
    return save({name: tensor.detach().contiguous().cpu() for name, tensor in weights.items()})


def _process_group(store: dist.Store, prefix: str, rank: int, world_size: int, device: torch.device):
    """A process group of its own (not torch's default one), so that groups can be rebuilt."""
    scoped = dist.PrefixStore(prefix, store)
    if device.type == "cuda":
        return dist.ProcessGroupNCCL(scoped, rank, world_size)
    return dist.ProcessGroupGloo(scoped, rank, world_size, GROUP_TIMEOUT)


def put_weights(weights: dict[str, torch.Tensor]) -> tuple[ray.ObjectRef, int]:
    """`weights` put into Ray's object store once: the reference each worker's `load_policy`
    call is given, and the bytes put."""
    data = weights_bytes(weights)
    return ray.put(data), len(data)


class CollectiveSync:
    """The trainer's end (rank 0) of a broadcast group with the workers (ranks 1..N)."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.address = ray.util.get_node_ip_address()
        self.store = dist.TCPStore(self.address, 0, None, is_master=True, wait_for_workers=False, timeout=GROUP_TIMEOUT)
        self.groups = 0
        self.group = None

    def connect(self, workers: list) -> None:
        """A new group of the trainer and `workers` (every worker's `join_weight_group` runs
        while the trainer joins)."""
        self.groups += 1
        prefix = f"weights-{self.groups}/"
        world_size = len(workers) + 1
        joined = [
            worker.join_weight_group.remote(self.address, self.store.port, prefix, rank, world_size)
            for rank, worker in enumerate(workers, start=1)
        ]
        self.group = _process_group(self.store, prefix, 0, world_size, self.device)
        ray.get(joined)

    def broadcast(self, name: str, version: int, weights: dict[str, torch.Tensor], workers: list) -> tuple[list, int]:
        """Send `weights` to every worker of the group as `name`'s `version`; returns the
        workers' pending `receive_policy` calls and the bytes sent."""
        manifest = [(key, tuple(tensor.shape)) for key, tensor in weights.items()]
        flat = torch.cat([tensor.detach().reshape(-1) for tensor in weights.values()]).to(self.device)
        received = [worker.receive_policy.remote(name, version, (manifest, str(flat.dtype))) for worker in workers]
        self.group.broadcast(flat, 0).wait()
        return received, flat.numel() * flat.element_size()


class WeightReceiver:
    """A worker's end of both paths: it turns what arrives into a safetensors file to load."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.group = None
        self.device = torch.device("cpu")

    def _file(self, name: str) -> Path:
        return self.directory / f"{name}.safetensors"

    def from_bytes(self, name: str, data: bytes) -> Path:
        path = self._file(name)
        with published(path, "the weights file") as partial:
            partial.write_bytes(data)
        return path

    def join(self, address: str, port: int, prefix: str, rank: int, world_size: int, device: torch.device) -> None:
        store = dist.TCPStore(address, port, None, is_master=False, timeout=GROUP_TIMEOUT)
        self.device = device
        self.group = _process_group(store, prefix, rank, world_size, device)

    def broadcast_file(self, name: str, described: tuple[Manifest, str]) -> Path:
        """Receive one broadcast of weights described by (manifest, dtype) and write their file."""
        manifest, dtype = described
        sizes = [int(torch.Size(shape).numel()) for _, shape in manifest]
        flat = torch.empty(sum(sizes), dtype=getattr(torch, dtype.removeprefix("torch.")), device=self.device)
        self.group.broadcast(flat, 0).wait()
        pieces = flat.cpu().split(sizes)
        return save_weights({key: piece.view(shape) for (key, shape), piece in zip(manifest, pieces)}, self._file(name))

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
