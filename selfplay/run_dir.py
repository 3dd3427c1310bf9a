"""The layout of a training run's directory: where every file `selfplay train` writes lies,
for each part of selfplay that writes or reads it.

    RUN_DIR/
      config.yaml                                the run's whole config (a resumed run reads it back)
      checkpoints/step-NNNNNN/                   the checkpoints (their contents: `selfplay.checkpoint`)
      league.sqlite                              the league's store, beside SQLite's -wal and -shm files
      league/snapshots/PLAYER@STEP.safetensors   the weights of the league's frozen snapshots
      sync/PLAYER.safetensors                    each learning player's latest weights, for its backend
      tensorboard/                               the metrics
      eval.jsonl                                 each evaluation of the policy (`selfplay.evaluation.training_curve`)
      learning_curve.png                         those evaluations by step
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from selfplay.errors import UserError


@dataclass(frozen=True)
class RunDir:
    """The files of the run whose directory is `path`."""

    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    def saved_config(self) -> Path:
        """The run's config file; raises UserError if it has none (`path` is no run directory)."""
        if not self.config.exists():
            raise UserError(f"'{self.path}' is not a run directory: it has no {self.config.name}.")
        return self.config

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def league_store(self) -> Path:
        return self.path / "league.sqlite"

    def league_store_files(self) -> list[Path]:
        """The league's store with SQLite's -wal and -shm files, those that exist."""
        return sorted(self.path.glob(f"{self.league_store.name}*"))

    def snapshot(self, name: str) -> Path:
        """The weights of the league snapshot `name`."""
        return self.path / "league" / "snapshots" / f"{name}.safetensors"

    def sync(self, player: str) -> Path:
        """The weights the learning player `player` last sent its generation backend."""
        return self.path / "sync" / f"{player}.safetensors"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tensorboard"

    @property
    def eval_log(self) -> Path:
        return self.path / "eval.jsonl"

    @property
    def learning_curve(self) -> Path:
        return self.path / "learning_curve.png"

    @classmethod
    def of_snapshot(cls, weights: str | Path) -> RunDir | None:
        """The run directory in whose layout `weights` is a snapshot's file; None if in none."""
        weights = Path(weights)
        for path in weights.parents:
            if cls(path).snapshot(weights.stem) == weights:
                return cls(path)
        return None
