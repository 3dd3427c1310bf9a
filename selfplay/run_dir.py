"""The layout of a training run's directory: where every file `selfplay train` writes lies,
for each part of selfplay that writes or reads it.

    RUN_DIR/
      run.lock                                   held by the process training the run (`RunLock`)
      config.yaml                                the run's whole config (a resumed run reads it back)
      config_history.jsonl                       each change a resume made to it, with the step
      checkpoints/step-NNNNNN/                   the checkpoints (their contents: `selfplay.checkpoint`)
      league.sqlite                              the league's store, beside SQLite's -wal and -shm files
      league/snapshots/PLAYER@STEP.safetensors   the weights of the league's frozen snapshots
      league/snapshots/PLAYER@STEP/              a LoRA learner's snapshot: its adapter alone, in peft's format
      tensorboard/                               the metrics
      wandb/                                     Weights & Biases' files, with `logging.wandb` (`selfplay.tracking`)
      trackers.json                              the W&B and MLflow runs' ids, which a resumed run logs to again
      eval.jsonl                                 each evaluation of the policy (`selfplay.evaluation.training_curve`)
      exploiters.jsonl                           each exploiter snapshot's figures (`selfplay.league.exploiter_log`)
      learning_curve.png                         those evaluations by step
"""

from __future__ import annotations

import fcntl
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from selfplay.errors import UserError

ADAPTER_CONFIG = "adapter_config.json"  # what marks a directory as a peft adapter


@dataclass(frozen=True)
class RunDir:
    """The files of the run whose directory is `path`."""

    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    @property
    def config_history(self) -> Path:
        return self.path / "config_history.jsonl"

    @property
    def lock_file(self) -> Path:
        return self.path / "run.lock"

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

    def adapter_snapshot(self, name: str) -> Path:
        """The adapter directory of the league snapshot `name` of a LoRA learner."""
        return self.path / "league" / "snapshots" / name

    @property
    def tensorboard(self) -> Path:
        return self.path / "tensorboard"

    @property
    def trackers(self) -> Path:
        return self.path / "trackers.json"

    @property
    def eval_log(self) -> Path:
        return self.path / "eval.jsonl"

    @property
    def exploiter_log(self) -> Path:
        return self.path / "exploiters.jsonl"

    @property
    def learning_curve(self) -> Path:
        return self.path / "learning_curve.png"

    @classmethod
    def of_checkpoint(cls, checkpoint: str | Path) -> RunDir | None:
        """The run directory in whose checkpoints `checkpoint` lies (a step's directory, or an
        exploiter's part of one); None if in none."""
        for path in Path(checkpoint).parents:
            if cls(path.parent).checkpoints == path:
                return cls(path.parent)
        return None

    @classmethod
    def of_snapshot(cls, weights: str | Path) -> RunDir | None:
        """The run directory in whose layout `weights` is a snapshot's file (or adapter
        directory); None if in none."""
        weights = Path(weights)
        for path in weights.parents:
            if weights in (cls(path).snapshot(weights.stem), cls(path).adapter_snapshot(weights.name)):
                return cls(path)
        return None


def is_adapter(path: str | Path) -> bool:
    """Whether `path` is a LoRA adapter directory as peft saves it (a LoRA learner's snapshot)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


class RunLock:
    """The exclusive right of one process to write a run directory: an OS lock (flock) on its
    `run.lock`, which names the holder's PID. The kernel drops the lock when the holder dies,
    kill -9 included, so no stale lock is ever left to clear; a lock file left by a killed run
    is simply taken over. `release` removes the file, and the directory too when the lock made
    it and nothing else was written there (a run that could not start leaves nothing)."""

    def __init__(self, run_dir: str | Path):
        files = RunDir(run_dir)
        self.path = files.lock_file
        # The directories the lock makes, innermost first: removed again if they stay empty.
        self.made = [d for d in [files.path, *files.path.parents] if not d.exists()]
        try:
            files.path.mkdir(parents=True, exist_ok=True)
            self._fd = self._acquire()
        except OSError as err:
            raise UserError(
                f"Cannot make the run directory '{files.path}' or lock it: {err.strerror}. Choose another run_dir."
            ) from None

    def _acquire(self) -> int:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 64).decode(errors="replace").strip()
                os.close(fd)
                raise UserError(
                    f"The run directory '{self.path.parent}' is in use by another selfplay process"
                    f"{f' (PID {holder})' if holder.isdigit() else ''}: two runs writing one directory would "
                    "mix their weights and configs. Wait for it to end (or stop it), or choose another run_dir."
                ) from None
            # A holder that released its lock unlinked the file it held: a lock taken on that
            # file meanwhile guards nothing, so take the one now at the path.
            if os.path.exists(self.path) and os.path.samestat(os.fstat(fd), os.stat(self.path)):
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                return fd
            os.close(fd)

    def release(self) -> None:
        """Give up the lock and remove its file. Where the file cannot be removed (a directory made
        read-only) the lock is given up all the same, and a warning says the file is left: it
        locks nothing, and the next run takes it over."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            self.path.unlink(missing_ok=True)  # while still held: see `_acquire`
        except OSError as err:
            print(
                f"warning: could not remove the run directory's lock file '{self.path}': {err.strerror}. It locks "
                "nothing now; the next run takes it over.",
                file=sys.stderr,
            )
            return
        finally:
            os.close(fd)
        for directory in self.made:
            try:
                directory.rmdir()  # only if empty
            except OSError:
                break
