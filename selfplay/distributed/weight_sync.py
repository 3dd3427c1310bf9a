"""How a learner's new weights reach the rollout workers after each update.

The weights come as a stream of (name, tensor) pairs (see `PolicyBackend.load_state`) and go
out a bucket at a time (at most WEIGHT_BUCKET_BYTES), each packed into one flat byte tensor
and its layout (`selfplay.backends.base.packed`), so that the trainer never holds more than a
bucket of them:

- Object store (`put_weights`): each bucket put into Ray's object store once per update; every
  worker on a node reads the same shared-memory copy. Simple, and it keeps every version a
  pending game may still need, so a restarted worker can replay its games with the weights
  they were first played with.
- Collective (`CollectiveSync`): each bucket broadcast from the trainer over a process group of
  the trainer and the workers, after a header giving its layout (an empty header ends the
  stream): gloo on CPU, NCCL on GPUs, where the bytes never touch the host. The group is built
  on a TCP store the trainer hosts, not with `ray.util.collective`, which refuses the driver
  process and fixes one group per process for good, so a restarted worker could never rejoin;
  a new group (under a new key prefix) is built whenever a worker joins.

Either way a worker hands the tensors to its backend's `load_state` as they come (for vLLM,
that also resets the prefix cache); no file is written on the way.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator

import ray
import torch
import torch.distributed as dist

from selfplay.backends.base import WEIGHT_BUCKET_BYTES, Weights, packed, unpacked, weight_buckets

GROUP_TIMEOUT = datetime.timedelta(minutes=5)


def _process_group(store: dist.Store, prefix: str, rank: int, world_size: int, device: torch.device):
    """A process group of its own (not torch's default one), so that groups can be rebuilt."""
    scoped = dist.PrefixStore(prefix, store)
    if device.type == "cuda":
        return dist.ProcessGroupNCCL(scoped, rank, world_size)
    return dist.ProcessGroupGloo(scoped, rank, world_size, GROUP_TIMEOUT)


def put_weights(weights: Weights) -> tuple[list[ray.ObjectRef], int]:
    """`weights` put into Ray's object store a packed bucket at a time: the references, in
    order, that a worker's `load_policy` call is given, and the bytes put."""
    references, sent = [], 0
    for bucket in weight_buckets(weights, WEIGHT_BUCKET_BYTES):
        layout, flat = packed(bucket)
        references.append(ray.put((layout, flat.numpy())))
        sent += flat.numel()
    return references, sent


def stored_weights(references: list[ray.ObjectRef]) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights `put_weights` put under `references`, read a bucket at a time."""
    for reference in references:
        layout, flat = ray.get(reference)
        yield from unpacked(layout, torch.tensor(flat))  # a copy: the object store's is read-only


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

    def broadcast(self, name: str, version: int, weights: Weights, workers: list) -> tuple[list, int]:
        """Send `weights` to every worker of the group as `name`'s `version`; returns the
        workers' pending `receive_policy` calls and the bytes sent."""
        received = [worker.receive_policy.remote(name, version) for worker in workers]
        sent = 0
        for bucket in weight_buckets(weights, WEIGHT_BUCKET_BYTES):
            layout, flat = packed(bucket, self.device)
            header = torch.frombuffer(bytearray(json.dumps(layout).encode()), dtype=torch.uint8)
            sent += self._send(header.to(self.device)) + self._send(flat)
        sent += self._send(torch.empty(0, dtype=torch.uint8, device=self.device))
        return received, sent

    def _send(self, data: torch.Tensor) -> int:
        """Broadcast the bytes `data` (uint8, on the group's device) after their count; returns
        the bytes sent."""
        count = torch.tensor([data.numel()], dtype=torch.int64, device=self.device)
        self.group.broadcast(count, 0).wait()
        if data.numel():
            self.group.broadcast(data, 0).wait()
        return count.numel() * count.element_size() + data.numel()


class WeightReceiver:
    """A worker's end of the broadcast group."""

    def __init__(self):
        self.group = None
        self.device = torch.device("cpu")

    def join(self, address: str, port: int, prefix: str, rank: int, world_size: int, device: torch.device) -> None:
        store = dist.TCPStore(address, port, None, is_master=False, timeout=GROUP_TIMEOUT)
        self.device = device
        self.group = _process_group(store, prefix, rank, world_size, device)

    def broadcast_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The weights of one `CollectiveSync.broadcast`, a bucket at a time as they arrive."""
        while (header := self._receive()).numel():
            layout = [(name, dtype, tuple(shape)) for name, dtype, shape in json.loads(bytes(header.cpu().numpy()))]
            yield from unpacked(layout, self._receive())

    def _receive(self) -> torch.Tensor:
        """The bytes of one `CollectiveSync._send`."""
        count = torch.empty(1, dtype=torch.int64, device=self.device)
        self.group.broadcast(count, 0).wait()
        data = torch.empty(int(count.item()), dtype=torch.uint8, device=self.device)
        if data.numel():
            self.group.broadcast(data, 0).wait()
        return data
