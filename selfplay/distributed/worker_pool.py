"""The rollout workers of a run: each step's matches split among Ray actors, new weights sent
to them, and games replayed on a new worker when one dies.

The trainer stays the single controller: it schedules the matches, `submit`s them, and later
`collect`s the trajectories of a step, in step order. Each step's matches are cut into one
contiguous share per worker, and every share samples with the step's seed, so a fixed number
of workers gives the same records for the same seed, and one worker gives the records the
trainer would make in its own process.

With `max_staleness` k, the trainer submits up to k steps ahead: workers play them with the
weights they have while the learner updates. Ray runs an actor's calls in the order they were
made, so weights sent after a step's games never reach those games.

A worker that dies (its process killed, its node gone) fails every share it held: the pool
starts a new worker, sends it the weights each of those shares was played with, and plays them
again. Results are only handed to the trainer, the league store's one writer, once a whole
step is in, so no game is lost or recorded twice.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import ray
import torch
from safetensors import safe_open

from selfplay.backends import SamplingSettings
from selfplay.backends.base import Weights
from selfplay.config import DistributedConfig
from selfplay.distributed.rollout_worker import RolloutWorker
from selfplay.distributed.weight_sync import CollectiveSync, put_weights
from selfplay.records import Trajectory
from selfplay.rollouts import MatchSpec, RolloutSettings

# Loading a model and its backend; vLLM's start-up on CPU takes about half a minute.
WORKER_START_SECONDS = 300


class WorkerKeepsFailing(RuntimeError):
    """Rollout workers that cannot start, or one share of a step's games that failed on
    `max_worker_failures` workers in a row."""


@dataclass
class _Share:
    """One worker's part of one step: its matches, the policy versions they are played with,
    the snapshots they seat, and the pending result."""

    step: int
    worker: int
    matches: list[MatchSpec]
    sampling: SamplingSettings
    versions: dict[str, int]
    snapshots: dict[str, tuple[list, int]]  # name -> (weights references, version), kept for a replay
    result: object = None
    failures: int = 0


@dataclass
class StepRollouts:
    """A step's games, as the trainer records them."""

    trajectories: list[Trajectory]
    versions: dict[str, int]  # each model player's policy version in these games
    game_metrics: dict[str, dict[str, float]]  # each game's own figures, averaged over workers
    play_s: float = 0.0  # seconds the slowest worker took to play its share
    sync_s: float = 0.0  # seconds the workers spent loading weights for these games
    restarts: int = 0  # workers started again while these games were played


class RolloutWorkers:
    def __init__(
        self,
        config: DistributedConfig,
        model_path: str,
        backend: str,
        precision: str,
        settings: RolloutSettings,
        *,
        learner_device: torch.device,
        current_weights: Callable[[str], Weights],
        device: str | None = None,
    ):
        self.config = config
        self.current_weights = current_weights  # a learning player's weights now, for a worker that joins late
        self.actor = ray.remote(RolloutWorker).options(
            num_cpus=config.worker_cpus, num_gpus=config.worker_gpus, max_restarts=0
        )
        self.worker_args = (model_path, backend, precision, settings)
        self.worker_options = {"device": device, "threads": max(1, int(config.worker_cpus))}
        self.workers = [
            self.actor.remote(*self.worker_args, **self.worker_options) for _ in range(config.rollout_workers)
        ]
        self.places = self._wait_started(self.workers)  # each worker's (node, process id)
        self.collective = CollectiveSync(learner_device) if config.weight_sync == "collective" else None
        if self.collective is not None:
            self.collective.connect(self.workers)
        self.weights: dict[tuple[str, int], list] = {}  # (player, version) -> object store references
        self.current: dict[str, int] = {}  # each learning player's newest version
        self.snapshot_refs: dict[str, tuple[list, int]] = {}  # snapshot -> (references, version)
        self.retired: list[list[str]] = [[] for _ in self.workers]  # per worker, to unload with its next share
        self.loaded: list[dict[str, int]] = [{} for _ in self.workers]  # per worker, versions sent to it
        self.loads: list[list] = [[] for _ in self.workers]  # per worker, pending load calls
        self.pending: dict[int, list[_Share]] = {}  # step -> shares
        self.published_bytes = 0
        self.restarts = 0

    def _wait_started(self, workers: list) -> list[tuple[str, int]]:
        try:
            return ray.get([worker.where.remote() for worker in workers], timeout=WORKER_START_SECONDS)
        except ray.exceptions.GetTimeoutError:
            raise WorkerKeepsFailing(
                f"Rollout workers did not start within {WORKER_START_SECONDS} s: the Ray cluster has no room for "
                f"them (each asks {self.config.worker_cpus:g} CPU and {self.config.worker_gpus:g} GPU; `ray status` "
                "shows what is free)."
            ) from None
        except ray.exceptions.RayActorError as err:
            raise WorkerKeepsFailing(f"A rollout worker failed to start: {err}") from err

    # -- weights -------------------------------------------------------------------------------

    def publish(self, name: str, weights: Weights, version: int) -> None:
        """Make `weights` (a stream of (name, tensor), read once to its end) the learning player
        `name`'s `version`, the one later shares play."""
        if self.collective is not None:
            loads, sent = self.collective.broadcast(name, version, weights, self.workers)
            for index, load in enumerate(loads):
                self.loads[index].append(load)
                self.loaded[index][name] = version
        else:
            self.weights[(name, version)], sent = put_weights(weights)
        self.current[name] = version
        self.published_bytes += sent

    def take_published_bytes(self) -> int:
        """The bytes of weights published since the last call."""
        sent, self.published_bytes = self.published_bytes, 0
        return sent

    def _send(self, index: int, name: str, version: int) -> None:
        """Have worker `index` serve `name` at `version` from its next call on."""
        if self.loaded[index].get(name, 0) == version:
            return  # a new worker serves the initial model as version 0; broadcasts reach every worker at once
        self.loads[index].append(self.workers[index].load_policy.remote(name, self.weights[(name, version)], version))
        self.loaded[index][name] = version

    def add_snapshot(self, name: str, weights: Path, version: int) -> None:
        """Make the league snapshot `name` (its safetensors file `weights`) available to workers."""
        if name not in self.snapshot_refs:
            with safe_open(str(weights), framework="pt") as file:
                references, _ = put_weights((key, file.get_tensor(key)) for key in file.keys())
            self.snapshot_refs[name] = (references, version)

    def retire(self, names: list[str]) -> None:
        for name in names:
            if self.snapshot_refs.pop(name, None) is not None:
                for retired in self.retired:
                    retired.append(name)

    # -- games ---------------------------------------------------------------------------------

    def submit(self, step: int, matches: list[MatchSpec], sampling: SamplingSettings, learning: list[str]) -> None:
        """Start playing `step`'s matches with the learning players' newest weights."""
        shares = []
        for index, part in enumerate(np.array_split(np.arange(len(matches)), len(self.workers))):
            seated = {label for position in part for label in matches[position].players}
            share = _Share(
                step,
                index,
                [matches[position] for position in part],
                sampling,
                versions={name: self.current.get(name, 0) for name in learning if name in seated},
                snapshots={name: snapshot for name, snapshot in self.snapshot_refs.items() if name in seated},
            )
            self._dispatch(share)
            shares.append(share)
        self.pending[step] = shares

    def _dispatch(self, share: _Share) -> None:
        index = share.worker
        for name, version in share.versions.items():
            self._send(index, name, version)
        retired, self.retired[index] = self.retired[index], []
        worker = self.workers[index]
        share.result = worker.play.remote(share.matches, share.sampling, share.versions, share.snapshots, retired)

    def collect(self, step: int) -> StepRollouts:
        """The trajectories of `step` (submitted earlier), waiting for them; a share whose
        worker died is replayed on a new worker."""
        shares = self.pending[step]
        trajectories: list[Trajectory] = []
        metrics: dict[str, list[dict[str, float]]] = defaultdict(list)
        restarts_before = self.restarts
        play_s = 0.0
        for share in shares:
            while True:
                try:
                    played, game_metrics, seconds = ray.get(share.result)
                    break
                except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as err:
                    share.failures += 1
                    if share.failures >= self.config.max_worker_failures:
                        raise WorkerKeepsFailing(
                            f"The games of step {step} failed on {share.failures} rollout workers in a row "
                            f"(distributed.max_worker_failures={self.config.max_worker_failures}); the last "
                            f"failure: {err}"
                        ) from err
                    self._replace(share.worker)
            trajectories += played
            play_s = max(play_s, seconds)
            for spec, values in game_metrics.items():
                metrics[spec].append(values)
        del self.pending[step]
        sync_s = self._load_seconds()
        self._forget_old_weights()
        versions = {name: version for share in shares for name, version in share.versions.items()}
        versions.update({name: version for share in shares for name, (_, version) in share.snapshots.items()})
        return StepRollouts(
            trajectories,
            versions,
            {spec: _mean(values) for spec, values in metrics.items()},
            play_s=play_s,
            sync_s=sync_s,
            restarts=self.restarts - restarts_before,
        )

    def _load_seconds(self) -> float:
        """The seconds the weight loads sent so far took; a load whose worker has died since is
        sent again with the share it served, when that share is collected."""
        seconds = 0.0
        for load in [load for loads in self.loads for load in loads]:
            try:
                seconds += ray.get(load)
            except ray.exceptions.RayActorError:
                pass
        self.loads = [[] for _ in self.workers]
        return seconds

    def _replace(self, index: int) -> None:
        """A new worker in place of the dead worker `index`, playing again every share it held,
        each with the weights it was first played with (the object store keeps them). With
        collective sync the trainer keeps only its current weights: a new group sends those,
        and the shares are played again with them (the same versions when max_staleness is 0)."""
        ray.kill(self.workers[index], no_restart=True)
        self.restarts += 1
        self.workers[index] = self.actor.remote(*self.worker_args, **self.worker_options)
        (self.places[index],) = self._wait_started([self.workers[index]])
        self.loaded[index], self.loads[index], self.retired[index] = {}, [], []
        shares = [self.pending[step][index] for step in sorted(self.pending)]
        if self.collective is not None:
            self.collective.connect(self.workers)
            for name, version in self.current.items():
                self.publish(name, self.current_weights(name), version)
            for share in shares:
                share.versions = {name: self.current[name] for name in share.versions}
        for share in shares:
            self._dispatch(share)

    def _forget_old_weights(self) -> None:
        """Drop the object store's copies that neither a pending share nor a new one can use."""
        needed = set(self.current.items())
        for shares in self.pending.values():
            needed |= {key for share in shares for key in share.versions.items()}
        for key in [key for key in self.weights if key not in needed]:
            del self.weights[key]

    def close(self) -> None:
        for worker in self.workers:
            ray.kill(worker, no_restart=True)
        self.workers = []


def _mean(values: list[dict[str, float]]) -> dict[str, float]:
    keys = {key for value in values for key in value}
    return {key: float(np.mean([value[key] for value in values if key in value])) for key in keys}
