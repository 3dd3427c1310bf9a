"""A learner of several processes: the trainer's handle on a group sharding one policy (FSDP2).

The trainer's process is rank 0 of the group; `learner.processes - 1` peers are started beside it,
one GPU each where there are GPUs. Every process holds a `Learner` with its shards of the model
(`selfplay.sharding`). The trainer calls its `LearnerGroup` as it would a `Learner`; each call is
first handed to every peer (a broadcast of the method's name and arguments), so that all the
processes run it together, each on its share of the samples, meeting in the same collectives.

A peer that dies breaks the group's next collective: the trainer's call then raises
`LearnerProcessDied` naming the process, and the run stops keeping its last checkpoint (which a
checkpoint write in progress never replaces: see `selfplay.checkpoint`).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import socket
import traceback
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from selfplay.config import LearnerConfig
from selfplay.errors import UserError
from selfplay.learner import Learner, NonFiniteUpdate
from selfplay.sharding import Shards, init_process_group, threads_per_process

# How long a process waits for the others in one collective before the group gives up: longer
# than any update or checkpoint write takes, shorter than a hung run should go unnoticed.
COLLECTIVE_TIMEOUT_MINUTES = 30
STOP = "stop"


class LearnerProcessDied(RuntimeError):
    """A process of the learner's group stopped (killed, out of memory, crashed)."""


def group_devices(processes: int, device: str | None) -> list[str]:
    """Each process's device: the machine's last N GPUs when the learner trains on GPUs (Ray's
    rollout workers get the first ones: see `cluster.connect`), else the CPU. Raises UserError
    when the machine cannot hold that many processes, naming what it lacks."""
    kind = torch.device(device).type if device else ("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda":
        if device is not None and torch.device(device).index is not None:
            raise UserError(
                f"learner.processes={processes} places one process on each of this machine's last {processes} GPUs: "
                "set device=cuda (not one GPU), or learner.processes=1."
            )
        count = torch.cuda.device_count()
        if processes > count:
            raise UserError(
                f"learner.processes={processes} needs {processes} GPUs, one per process; this machine has {count}. "
                f"Set learner.processes to at most {count}."
            )
        return [f"cuda:{count - processes + rank}" for rank in range(processes)]
    if kind != "cpu":
        raise UserError(f"learner.processes above 1 runs on GPUs (NCCL) or the CPU (gloo), not on {kind}.")
    cores = os.cpu_count() or 1
    if processes > cores:
        raise UserError(
            f"learner.processes={processes} needs a CPU core per process; this machine has {cores}. Set "
            f"learner.processes to at most {cores}."
        )
    return ["cpu"] * processes


class LearnerGroup:
    """Rank 0 of a sharded learner, with the same interface as `Learner`."""

    def __init__(
        self,
        model_path: str,
        config: LearnerConfig,
        *,
        temperature: float = 1.0,
        token_sum_length: int = 64,
        device: str | None = None,
        seed: int = 0,
        resume_from: str | Path | None = None,
    ):
        devices = group_devices(config.processes, device)
        port = _free_port()
        arguments = {
            "model_path": model_path,
            "config": config,
            "temperature": temperature,
            "token_sum_length": token_sum_length,
            "seed": seed,
            "resume_from": resume_from,
        }
        context = multiprocessing.get_context("spawn")  # a fork would copy the trainer's threads and engines
        self.peers = [
            context.Process(
                target=_serve,
                args=(Shards(rank, config.processes, devices[rank]), port, arguments),
                name=f"selfplay-learner-{rank}",
                daemon=True,
            )
            for rank in range(1, config.processes)
        ]
        for peer in self.peers:
            peer.start()
        shards = Shards(0, config.processes, devices[0])
        self.shards = shards
        init_process_group(shards, "127.0.0.1", port, COLLECTIVE_TIMEOUT_MINUTES)
        failure = None
        try:
            self.local = Learner(**arguments, shards=shards)
        except Exception as err:  # the peers hear of it below, and stop
            failure = err
        problems = shards.gather(None if failure is None else f"{type(failure).__name__}: {failure}")
        if any(problem is not None for problem in problems):
            for peer in self.peers:
                peer.join()
            dist.destroy_process_group()
            if failure is not None:
                raise failure
            raise RuntimeError(f"A learner process could not start: {next(p for p in problems if p)}")

    # -- what every process runs ---------------------------------------------------------------

    def _call(self, method: str, *args):
        """Run `method` on every process of the group; returns rank 0's result."""
        try:
            self.shards.from_first((method, args))
            return getattr(self.local, method)(*args)
        except NonFiniteUpdate:
            raise
        except RuntimeError as err:  # a collective a dead peer broke (DistBackendError is one)
            self._raise_if_a_peer_died(err)
            raise

    def update(self, samples, lr=None):
        return self._call("update", samples, lr)

    def scheduled_update(self, samples, step: int, total_steps: int):
        return self._call("scheduled_update", samples, step, total_steps)

    def move_reference(self) -> None:
        self._call("move_reference")

    def held_bytes(self) -> list[dict[str, int]]:
        return self._call("held_bytes")

    def save_pretrained(self, directory: Path) -> None:
        self._call("save_pretrained", directory)

    def save_training_state(self, directory: Path) -> None:
        self._call("save_training_state", directory)

    def load_training_state(self, directory: Path) -> None:
        self._call("load_training_state", directory)

    def policy_weights(self, dtype: torch.dtype = torch.float32) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's weights, one whole tensor at a time (see `Learner.policy_weights`)."""
        weights = self._call("policy_weights", dtype)
        try:
            yield from weights
        except RuntimeError as err:
            self._raise_if_a_peer_died(err)
            raise

    def export_weights(self, path: Path, dtype: torch.dtype = torch.float32) -> Path:
        from selfplay.backends.base import save_weights

        return save_weights(dict(self.policy_weights(dtype)), path)

    @contextlib.contextmanager
    def scoring_model(self):
        """The policy as one plain causal LM on this process, for probes (exact exploitability):
        built from the streamed weights, and freed afterwards."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_config(self.local.model.config, dtype=torch.float32)
        model.load_state_dict(dict(self.policy_weights()), strict=not self.local.tied_embeddings)
        model.tie_weights()
        with torch.no_grad():
            yield model.to(self.device).eval()

    # -- what rank 0 reads ---------------------------------------------------------------------

    @property
    def config(self) -> LearnerConfig:
        return self.local.config

    @property
    def tokenizer(self):
        return self.local.tokenizer

    @property
    def device(self) -> str:
        return self.local.device

    @property
    def reference_moved(self) -> bool:
        return self.local.reference_moved

    # -- faults and shutdown -------------------------------------------------------------------

    def _raise_if_a_peer_died(self, err: BaseException) -> None:
        for peer in self.peers:
            peer.join(timeout=5)  # a broken collective comes just before the exit is seen
            if peer.exitcode is not None and peer.exitcode != 0:
                how = f"killed by signal {-peer.exitcode}" if peer.exitcode < 0 else f"exit code {peer.exitcode}"
                raise LearnerProcessDied(f"learner process {peer.name.rsplit('-', 1)[1]} stopped ({how})") from err

    def close(self) -> None:
        """Stop the peers and leave the group."""
        if not dist.is_initialized():
            return
        if all(peer.is_alive() for peer in self.peers):
            with contextlib.suppress(RuntimeError):
                self.shards.from_first((STOP, ()))
        for peer in self.peers:
            peer.join(timeout=30)
            if peer.is_alive():
                peer.kill()
        dist.destroy_process_group()


def _serve(shards: Shards, port: int, arguments: dict) -> None:
    """A peer's life: join the group, build its learner, then run each call rank 0 hands over
    until told to stop. An error in a call is rank 0's to report (it meets the same one, or a
    broken collective); the peer goes on to the next call."""
    torch.set_num_threads(threads_per_process(shards.processes))
    init_process_group(shards, "127.0.0.1", port, COLLECTIVE_TIMEOUT_MINUTES)
    problem, learner = None, None
    try:
        learner = Learner(**arguments, shards=shards)
    except Exception as err:
        problem = f"{type(err).__name__}: {err}"
    if any(p is not None for p in shards.gather(problem)):
        dist.destroy_process_group()
        return
    while True:
        method, args = shards.from_first(None)
        if method == STOP:
            break
        try:
            result = getattr(learner, method)(*args)
            if isinstance(result, Iterator):  # a stream: every tensor is gathered by all
                for _ in result:
                    pass
        except Exception:
            traceback.print_exc()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
