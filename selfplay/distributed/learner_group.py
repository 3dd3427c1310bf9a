"""A learner of several processes: the trainer's handle on a group sharding one policy (FSDP2).

The trainer's process is rank 0 of the group; `learner.processes - 1` peers are started beside it,
one GPU each where there are GPUs. Every process holds a `Learner` with its shards of the model
(`selfplay.sharding`). The trainer calls its `LearnerGroup` as it would a `Learner`; each call is
first handed to every peer (a broadcast of the method's name and arguments), so that all the
processes run it together, each on its share of the samples, meeting in the same collectives.

A peer that dies breaks the group's next collective: the trainer's call then raises
`LearnerProcessDied` naming the process, and the run stops keeping its last checkpoint (which a
checkpoint write in progress never replaces: see `selfplay.checkpoint`).

Every process ends within seconds of the trainer's, however that ends. An interrupt (SIGINT)
is the trainer's to act on: the peers ignore it (a terminal sends it to every process), and the
trainer kills them the moment it arrives, from a thread of its own, since its main thread may
be waiting in a collective (on a stopped peer, until the collective's timeout) where Python runs
no signal handler. Closing after a call that did not end kills the peers too: they may be
waiting in its collectives, where no message to stop reaches them. A peer whose trainer is gone
(killed with no cleanup) exits by itself.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from selfplay.config import LearnerConfig
from selfplay.errors import UserError
from selfplay.files import WRITE_FAILURES
from selfplay.learner import Learner, NonFiniteUpdate
from selfplay.sharding import Shards, init_process_group, threads_per_process

# How long a process waits for the others in one collective before the group gives up: longer
# than any update or checkpoint write takes, shorter than a hung run should go unnoticed.
COLLECTIVE_TIMEOUT_MINUTES = 30
# How long peers told to stop get to leave the group before they are killed.
STOP_GRACE_SECONDS = 10
# How often a peer checks that the trainer's process is still there.
PARENT_CHECK_SECONDS = 1.0
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
                args=(Shards(rank, config.processes, devices[rank]), port, arguments, os.getpid()),
                name=f"selfplay-learner-{rank}",
                daemon=True,
            )
            for rank in range(1, config.processes)
        ]
        for peer in self.peers:
            peer.start()
        self.interrupted, self.between_calls = False, False
        self.interrupt_watch = InterruptWatch(self._interrupt)
        self.shards = shards = Shards(0, config.processes, devices[0])
        try:
            with self._group_call():  # every process builds its learner
                init_process_group(shards, "127.0.0.1", port, COLLECTIVE_TIMEOUT_MINUTES)
                failure = None
                try:
                    self.local = Learner(**arguments, shards=shards)
                except Exception as err:  # the peers hear of it below, and stop
                    failure = err
                problems = shards.gather(None if failure is None else f"{type(failure).__name__}: {failure}")
            if failure is not None:
                raise failure
            if any(problem is not None for problem in problems):
                raise RuntimeError(f"A learner process could not start: {next(p for p in problems if p)}")
        except BaseException:
            self.between_calls = False  # a group that did not start is not told to stop: its peers are ended
            self.close()
            raise

    # -- what every process runs ---------------------------------------------------------------

    def _call(self, method: str, *args):
        """Run `method` on every process of the group; returns rank 0's result."""
        with self._group_call():
            self.shards.from_first((method, args))
            return getattr(self.local, method)(*args)

    @contextlib.contextmanager
    def _group_call(self):
        """A call that every process runs: the group is between calls again once it ends, and a
        fault that breaks it (a peer that died, an interrupt) is raised as such."""
        self.between_calls = False
        # A peer that died between calls: gloo does not always see its closed connection, and the
        # call's first collective would then wait for it until the timeout.
        self._raise_if_a_peer_died(None, wait_seconds=0)
        try:
            yield
        except BaseException as err:
            if self.interrupted:  # the peers were killed for it, which broke the call
                raise KeyboardInterrupt from None
            if isinstance(err, RuntimeError) and not isinstance(err, NonFiniteUpdate):
                self._raise_if_a_peer_died(err)  # a collective a dead peer broke (DistBackendError is one)
            raise
        self.between_calls = True

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
        with self._group_call():
            self.shards.from_first(("policy_weights", (dtype,)))
            yield from self.local.policy_weights(dtype)

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

    def _raise_if_a_peer_died(self, err: BaseException | None, wait_seconds: float = 5) -> None:
        for peer in self.peers:
            peer.join(timeout=wait_seconds)  # a broken collective comes just before the exit is seen
            if peer.exitcode is not None and peer.exitcode != 0:
                how = f"killed by signal {-peer.exitcode}" if peer.exitcode < 0 else f"exit code {peer.exitcode}"
                raise LearnerProcessDied(f"learner process {peer.name.rsplit('-', 1)[1]} stopped ({how})") from err

    def _interrupt(self) -> None:
        self.interrupted = True
        for peer in self.peers:
            peer.kill()

    def close(self) -> None:
        """Stop the peers and leave the group. Peers waiting for the next call are told to stop;
        after a call that did not end (a failure, an interrupt) they are killed, as they may be
        waiting in its collectives."""
        if self.interrupt_watch is None:  # closed already
            return
        if self.between_calls and all(peer.is_alive() for peer in self.peers):
            with contextlib.suppress(RuntimeError):
                self.shards.from_first((STOP, ()))
        else:
            for peer in self.peers:
                peer.kill()
        for peer in self.peers:
            peer.join(timeout=STOP_GRACE_SECONDS)
            if peer.is_alive():
                peer.kill()
                peer.join()
        self.interrupt_watch.close()
        self.interrupt_watch = None
        if dist.is_initialized():
            dist.destroy_process_group()


class InterruptWatch:
    """Calls `on_interrupt` from a thread of its own the moment SIGINT reaches this process,
    whatever its main thread is doing: Python runs a signal's handler (KeyboardInterrupt) only
    between the main thread's bytecodes, never while it waits in C++ (a collective). The signal
    handler writes the signal's number to `signal.set_wakeup_fd`, which this thread reads (and
    passes on to the file it replaced). Only the main thread may set it: made elsewhere, a watch
    does nothing."""

    def __init__(self, on_interrupt: Callable[[], None]):
        self.reading, self.writing = os.pipe()
        os.set_blocking(self.writing, False)  # the signal handler never waits
        try:
            self.replaced = signal.set_wakeup_fd(self.writing, warn_on_full_buffer=False)
        except ValueError:  # not the main thread
            os.close(self.reading)
            os.close(self.writing)
            self.writing = None
            return
        threading.Thread(target=self._watch, args=(on_interrupt,), name="selfplay-interrupt-watch", daemon=True).start()

    def _watch(self, on_interrupt: Callable[[], None]) -> None:
        while signals := os.read(self.reading, 64):
            if self.replaced >= 0:
                with contextlib.suppress(OSError):
                    os.write(self.replaced, signals)
            if signal.SIGINT in signals:
                on_interrupt()
        os.close(self.reading)

    def close(self) -> None:
        """Give the wakeup file back; the thread ends with its pipe."""
        if self.writing is not None:
            signal.set_wakeup_fd(self.replaced)
            os.close(self.writing)
            self.writing = None


def _serve(shards: Shards, port: int, arguments: dict, trainer_pid: int) -> None:
    """A peer's life: join the group, build its learner, then run each call rank 0 hands over
    until told to stop. An error in a call is rank 0's to report (it meets the same one, or a
    broken collective); the peer goes on to the next call. An interrupt is the trainer's to act
    on, and the peer ends when the trainer's process does."""
    from transformers.utils import logging as transformers_logging

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_without, args=(trainer_pid,), name="selfplay-trainer-watch", daemon=True).start()
    # The trainer's output is the run's: and a bar's lock, registered with multiprocessing's
    # resource tracker, would be reported leaked by a peer that was killed.
    transformers_logging.disable_progress_bar()
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
        except Exception as err:
            if not isinstance(err, WRITE_FAILURES):  # a failed write (of a sharded checkpoint) every process meets
                traceback.print_exc()
    dist.destroy_process_group()


def _exit_without(trainer_pid: int) -> None:
    """Exit this process once the trainer's process `trainer_pid`, its parent, is gone (as
    torch's DataLoader workers do): a trainer killed with no cleanup leaves no peer behind."""
    while os.getppid() == trainer_pid:
        time.sleep(PARENT_CHECK_SECONDS)
    os._exit(1)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
