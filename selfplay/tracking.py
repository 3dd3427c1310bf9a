"""Where a training run's scalars go: TensorBoard in the run directory (the default), and
Weights & Biases and MLflow when the config's `logging` section names them. Each tracker gets
every step's finite metrics at that step, under the same names (MLflow's, with the characters it
refuses replaced: `mlflow_name`), and W&B and MLflow get the run's config. Only the trackers
asked for are imported.

A resumed run logs to the same W&B and MLflow runs, whose ids the run directory keeps
(`trackers.json`), and no tracker holds a step twice: TensorBoard drops what a killed run logged
after its last checkpoint and takes the replayed steps again (purge_step), while W&B and MLflow
keep the steps they hold, which the replay computes again as before, and take the later ones.

W&B and MLflow are observers of a run: one that fails mid-run (its server gone, its store's disk
full) is given up for the rest of the run, with a warning naming it and why, and the run ends
saying which steps it missed; `logging.on_tracker_failure=stop` stops the run instead. MLflow's
HTTP retries are bounded (`MLFLOW_HTTP_BOUNDS`), and so is W&B's upload at the end of a run.
TensorBoard's files are the run's own: a failure to write them stops the run, as any other does.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Protocol

from tqdm import tqdm

from selfplay.config import LoggingConfig, MlflowConfig, TrainConfig, WandbConfig, config_to_dict, settings_by_key
from selfplay.errors import UserError, in_one_line
from selfplay.files import replace_text
from selfplay.run_dir import RunDir

# Metric names MLflow refuses: any character but these (league players' "@", game parameters' "(=,)").
MLFLOW_REFUSED = re.compile(r"[^/\w.\- :]")
# MLflow's own HTTP settings retry a request to a server that is gone for about 8 minutes; these
# give up within seconds (a minute for a server that accepts and never answers). Set in the
# environment, they hold instead.
MLFLOW_HTTP_BOUNDS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
}
WANDB_FINISH_TIMEOUT_S = 120  # W&B's upload at the end of a run; what is left stays in RUN_DIR/wandb for `wandb sync`


class Tracker(Protocol):
    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class TensorBoardTracker:
    def __init__(self, files: RunDir, step: int):
        from torch.utils.tensorboard import SummaryWriter

        # purge_step drops anything a killed run logged after its last checkpoint.
        self.writer = SummaryWriter(str(files.tensorboard), purge_step=step + 1)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A W&B run, in RUN_DIR/wandb, given the steps from `first_step` on; `run_id` resumes that one."""

    def __init__(
        self,
        wandb: ModuleType,
        settings: WandbConfig,
        files: RunDir,
        config: TrainConfig,
        run_id: str | None,
        first_step: int,
    ):
        self.run = wandb.init(
            project=settings.project,
            entity=settings.entity,
            mode=settings.mode,
            dir=files.path,
            name=files.path.name,
            id=run_id,
            resume="allow" if run_id else None,
            config=config_to_dict(config),
            reinit="create_new",  # its own run, whatever else this process logs to W&B
            # quiet: no summary table under the run's own report
            settings=wandb.Settings(quiet=True, finish_timeout=WANDB_FINISH_TIMEOUT_S, finish_timeout_raises=True),
        )
        self.id = self.run.id
        self.first_step = first_step

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if step >= self.first_step:
            self.run.log(dict(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    """An MLflow run with the config's settings as its params (`learner.lr`, ...), given the steps
    from `first_step` on; `run_id` resumes that one. MLflow's params cannot change: a resume's
    changes to the config are in the run directory's config history."""

    def __init__(
        self,
        mlflow: ModuleType,
        settings: MlflowConfig,
        files: RunDir,
        config: TrainConfig,
        run_id: str | None,
        first_step: int,
    ):
        self.mlflow = mlflow
        for name, value in MLFLOW_HTTP_BOUNDS.items():
            os.environ.setdefault(name, value)
        # Its database layer logs each error it raises with a traceback, which `Trackers` says in one line.
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
        self.client = mlflow.MlflowClient(tracking_uri=settings.tracking_uri)
        run = self._existing_run(run_id) if run_id else None
        if run is None:
            experiment = self.client.get_experiment_by_name(settings.experiment)
            known = experiment.experiment_id if experiment else None
            run = self.client.create_run(
                known or self.client.create_experiment(settings.experiment), run_name=files.path.name
            )
        else:
            self.client.update_run(run.info.run_id, status="RUNNING")
        self.id = run.info.run_id
        held = run.data.params
        params = [mlflow.entities.Param(k, str(v)) for k, v in settings_by_key(config).items() if k not in held]
        self.client.log_batch(self.id, params=params)
        self.first_step = first_step

    def _existing_run(self, run_id: str):
        try:
            return self.client.get_run(run_id)
        except self.mlflow.exceptions.MlflowException:  # not in this tracking store: a new run
            return None

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if step < self.first_step:
            return
        now = int(time.time() * 1000)
        entries = [self.mlflow.entities.Metric(mlflow_name(k), v, now, step) for k, v in metrics.items()]
        self.client.log_batch(self.id, metrics=entries)

    def close(self) -> None:
        self.client.set_terminated(self.id)


def mlflow_name(name: str) -> str:
    """`name` as MLflow takes it: each character it refuses replaced by an underscore."""
    return MLFLOW_REFUSED.sub("_", name)


@dataclass
class TrackerFailure:
    """Why a tracker was given up, and the steps it did not get."""

    reason: str
    missed: list[int] = field(default_factory=list)


class TrackerFailed(UserError):
    """W&B or MLflow failed mid-run, and `logging.on_tracker_failure=stop` stops the run."""


class Trackers:
    """The run's trackers, each given the same metrics at each step. With W&B or MLflow, the run
    directory's trackers.json keeps their runs' ids and the last step logged to them."""

    def __init__(self, files: RunDir, run_ids: dict[str, str], logged_through: int, on_failure: str):
        self.files, self.run_ids, self.logged_through = files, run_ids, logged_through
        self.on_failure = on_failure
        self.tensorboard: TensorBoardTracker | None = None
        self.observers: dict[str, Tracker] = {}  # W&B and MLflow, by name
        self.failures: dict[str, TrackerFailure] = {}  # the observers given up, by name

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        finite = {name: value for name, value in metrics.items() if math.isfinite(value)}
        if self.run_ids and step != self.logged_through:
            # Saved first: a run killed in between leaves a step missing in W&B and MLflow, never one twice.
            self.logged_through = step
            self.save()
        if self.tensorboard is not None:
            self.tensorboard.log(finite, step)
        for name, tracker in self.observers.items():
            if name in self.failures:
                self.failures[name].missed.append(step)
                continue
            try:
                tracker.log(finite, step)
            except Exception as err:
                self._give_up(name, err, step)

    def _give_up(self, name: str, err: Exception, step: int) -> None:
        reason = in_one_line(err)
        self.failures[name] = TrackerFailure(reason, [step])  # and not closed: it would fail again
        if self.on_failure == "stop":
            raise TrackerFailed(
                f"{TRACKER_NAMES[name]} could not log step {step}: {reason}. {TRACKER_FIXES[name]} Or set "
                "logging.on_tracker_failure=continue to train on without it."
            ) from None
        tqdm.write(
            f"warning: {TRACKER_NAMES[name]} could not log step {step} ({reason}) and gets no more of this run's "
            "steps; training goes on (logging.on_tracker_failure=stop would stop it).",
            file=sys.stderr,
        )

    def _working(self) -> list[str]:
        return [name for name in self.observers if name not in self.failures]

    def save(self) -> None:
        record = {"run_ids": self.run_ids, "logged_through": self.logged_through}
        replace_text(self.files.trackers, json.dumps(record, indent=1) + "\n", "the trackers' run ids")

    def close(self) -> None:
        """Close each tracker; say which steps a given-up one missed. Only TensorBoard's failure raises."""
        for name in self._working():
            try:
                self.observers[name].close()
            except Exception as err:
                self.failures[name] = TrackerFailure(in_one_line(err))
        for name, failure in self.failures.items():
            if failure.missed and self.on_failure == "stop":
                continue  # the error that stopped the run says it
            print(f"warning: {TRACKER_NAMES[name]} {missed_steps(failure)}: {failure.reason}.", file=sys.stderr)
        if self.tensorboard is not None:
            self.tensorboard.close()


def missed_steps(failure: TrackerFailure) -> str:
    """What a tracker that `failure` gave up did not get, for a warning that names it before."""
    if not failure.missed:
        return "could not close its run"
    steps = sorted(set(failure.missed))
    if len(steps) == 1:
        return f"did not get step {steps[0]} of this run"
    return f"did not get steps {steps[0]}-{steps[-1]} of this run ({len(steps)} logged steps)"


TRACKER_NAMES = {"wandb": "Weights & Biases", "mlflow": "MLflow"}
TRACKER_FIXES = {
    "wandb": "Log in (`wandb login`), set logging.wandb.mode=offline, or unset logging.wandb.project.",
    "mlflow": "Check logging.mlflow.tracking_uri (a server's URL, or a database: sqlite:///PATH), or unset it.",
}


def open_trackers(config: TrainConfig, step: int, resume: bool) -> Trackers:
    """The trackers `config.logging` asks for, from `step` on. A resumed run logs to the W&B and
    MLflow runs it logged to before, from the step after the last one they got. Raises
    UserError, before opening any, if W&B or MLflow is asked for and not installed."""
    settings, files = config.logging, RunDir(config.run_dir)
    modules = installed_trackers(settings)
    saved = json.loads(files.trackers.read_text()) if resume and files.trackers.exists() else {}
    trackers = Trackers(files, saved.get("run_ids", {}), saved.get("logged_through", -1), settings.on_tracker_failure)
    try:
        if settings.tensorboard:
            trackers.tensorboard = TensorBoardTracker(files, step)
        for name, kind, section in (
            ("wandb", WandbTracker, settings.wandb),
            ("mlflow", MlflowTracker, settings.mlflow),
        ):
            module = modules.get(name)
            if module is not None:
                run_id = trackers.run_ids.get(name)
                try:
                    tracker = kind(module, section, files, config, run_id, trackers.logged_through + 1 if run_id else 0)
                except Exception as err:  # the service refused the settings or the login: the user's to fix
                    raise UserError(
                        f"{TRACKER_NAMES[name]} could not start this run's log: {in_one_line(err)}. "
                        f"{TRACKER_FIXES[name]}"
                    ) from None
                trackers.observers[name] = tracker
                trackers.run_ids[name] = tracker.id
    except BaseException:
        trackers.close()
        raise
    if trackers.run_ids:
        trackers.save()
    else:
        files.trackers.unlink(missing_ok=True)  # an earlier attempt's, which a new run does not go on
    return trackers


def installed_trackers(settings: LoggingConfig) -> dict[str, ModuleType]:
    """The modules of the trackers beside TensorBoard that `settings` asks for, by name. Raises
    UserError naming the extra to install if one is not installed."""
    asked = {
        "wandb": ("logging.wandb.project", settings.wandb.project),
        "mlflow": ("logging.mlflow.tracking_uri", settings.mlflow.tracking_uri),
    }
    return {module: _installed(module, setting) for module, (setting, value) in asked.items() if value}


def _installed(module: str, setting: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(
            f"{setting} asks for {module}, which is not installed: pip install 'selfplay[trackers]', or unset "
            f"{setting}."
        ) from None
