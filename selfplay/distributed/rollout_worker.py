"""A rollout worker: a Ray actor that plays its share of a step's matches.

It owns a backend per model player it seats (each learning player, at the version the trainer
last sent it, and each league snapshot, loaded once) and runs the ordinary rollout engine over
its matches, so a worker's records are exactly the records the trainer would make itself. Ray
runs an actor's calls one at a time in the order the trainer made them: weights sent after a
`play` call reach the worker only after that call's games are over, so every game is played by
one policy version.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace

import ray
import torch
from transformers.utils import logging as transformers_logging

from selfplay.backends import PolicyBackend, SamplingSettings, make_backend
from selfplay.distributed.weight_sync import WeightReceiver, stored_weights
from selfplay.games import TextGame, make_game
from selfplay.records import Trajectory
from selfplay.rollouts import MatchSpec, RolloutEngine, RolloutSettings


class RolloutWorker:
    def __init__(
        self,
        model_path: str,
        backend: str,
        precision: str,
        settings: RolloutSettings,
        *,
        device: str | None = None,
        threads: int = 1,
    ):
        torch.set_num_threads(threads)
        transformers_logging.disable_progress_bar()
        self.model_path = model_path
        self.backend_kind = backend
        self.precision = precision
        self.device = device
        self.settings = settings
        self.policies: dict[str, PolicyBackend] = {}  # learning players, by name
        self.snapshots: dict[str, PolicyBackend] = {}  # frozen league players, by name
        self.games: dict[str, TextGame] = {}  # one instance per game spec, asked for its figures
        self.receiver = WeightReceiver()

    def where(self) -> tuple[str, int]:
        """The Ray node and the process this worker runs in; answering also says it has started."""
        return ray.get_runtime_context().get_node_id(), os.getpid()

    # -- weights in ----------------------------------------------------------------------------

    def _policy(self, name: str) -> PolicyBackend:
        """The learning player's backend; a new one serves the initial model as version 0."""
        if name not in self.policies:
            self.policies[name] = make_backend(self.backend_kind, self.model_path, self.precision, **self._on_device())
        return self.policies[name]

    def _on_device(self) -> dict:
        return {"device": self.device} if self.backend_kind == "hf" else {}

    def load_policy(self, name: str, weights: list[ray.ObjectRef], version: int) -> float:
        """Serve the weights `put_weights` stored under the references `weights` as the learning
        player `name`'s `version`; returns the seconds it took."""
        started = time.perf_counter()
        self._policy(name).load_state(stored_weights(weights), version)
        return time.perf_counter() - started

    def join_weight_group(self, address: str, port: int, prefix: str, rank: int, world_size: int) -> None:
        """Join the trainer's process group for broadcast weights (see `CollectiveSync`)."""
        self.receiver.join(address, port, prefix, rank, world_size, self._receive_device())

    def receive_policy(self, name: str, version: int) -> float:
        """Take part in the trainer's broadcast of `name`'s `version` and serve it; returns the
        seconds it took."""
        started = time.perf_counter()
        weights = self.receiver.broadcast_weights()
        try:
            self._policy(name).load_state(weights, version)
        finally:
            for _ in weights:  # the rest of a stream the backend refused: the trainer's send then ends
                pass
        return time.perf_counter() - started

    def _receive_device(self) -> torch.device:
        return torch.device("cuda") if torch.cuda.is_available() and self.device != "cpu" else torch.device("cpu")

    # -- games ---------------------------------------------------------------------------------

    def play(
        self,
        matches: list[MatchSpec],
        sampling: SamplingSettings,
        versions: dict[str, int],
        snapshots: dict[str, tuple[list, int]],
        retired: list[str],
    ) -> tuple[list[Trajectory], dict[str, dict[str, float]], float]:
        """Play `matches` with the learning players at `versions` and the league `snapshots`
        (name -> (weights references, version)); unload the `retired` snapshots first.
        Returns the trajectories in the order the games ended, each game's own figures, and
        the seconds the games took."""
        started = time.perf_counter()
        for name in retired:
            backend = self.snapshots.pop(name, None)
            if backend is not None:
                backend.close()
        for name, version in versions.items():
            served = self._policy(name).version
            if served != version:  # the trainer sends every version before the games that use it
                raise RuntimeError(f"worker serves {name} version {served}, the games need version {version}")
        for name, (references, version) in snapshots.items():
            if name not in self.snapshots:
                backend = make_backend("hf", self.model_path, self.precision, device=self.device, frozen=True)
                backend.load_state(stored_weights(references), version)
                self.snapshots[name] = backend
        seated = {label: label for match in matches for label in match.players}  # scripted agents by spec
        seated.update({name: self.policies[name] for name in versions})
        seated.update({name: self.snapshots[name] for name in snapshots})
        engine = RolloutEngine(seated, replace(self.settings, sampling=sampling))
        trajectories = list(engine.run(matches))
        for spec in {m.game for m in matches} - set(self.games):
            self.games[spec] = make_game(spec)
        figures = {spec: self.games[spec].training_metrics() for spec in {m.game for m in matches}}
        return trajectories, figures, time.perf_counter() - started

    def close(self) -> None:
        for backend in [*self.policies.values(), *self.snapshots.values()]:
            backend.close()
