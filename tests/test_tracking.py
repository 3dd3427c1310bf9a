"""Weights & Biases and MLflow beside TensorBoard: the same scalars under the same names at the
same steps, the run's config attached, no step twice after a resume, and neither imported
unless the config asks for it. W&B runs offline and MLflow in a SQLite file, both under the
test's directory: nothing goes over the network."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import sqlite3
import struct
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from selfplay.config import config_to_dict, load_config, settings_by_key
from selfplay.errors import UserError
from selfplay.run_dir import RunDir
from selfplay.tracking import TRACKER_FIXES, TrackerFailed, Trackers, mlflow_name, open_trackers
from selfplay.train import Trainer
from tests.test_train import TINY, resume

# A W&B offline run's file: a header, then LevelDB-log records (32 KiB blocks, each record's
# pieces behind a 7-byte header: checksum, length, kind) holding W&B's protobuf `Record`s.
WANDB_HEADER, LOG_BLOCK, PIECE_HEADER = 7, 32768, 7
PADDING, FULL, FIRST, LAST = 0, 1, 2, 4


def wandb_records(path: Path):
    """The protobuf records of the W&B offline run file at `path`, in order."""
    from wandb.proto.wandb_internal_pb2 import Record

    data, at, record = path.read_bytes(), WANDB_HEADER, b""
    assert data.startswith(b":W&B")
    while at + PIECE_HEADER <= len(data):
        if LOG_BLOCK - at % LOG_BLOCK < PIECE_HEADER:  # a block's tail too short for a header is padding
            at += LOG_BLOCK - at % LOG_BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[at : at + PIECE_HEADER])
        piece = data[at + PIECE_HEADER : at + PIECE_HEADER + length]
        at += PIECE_HEADER + length
        if kind == PADDING:
            continue
        record = piece if kind in (FULL, FIRST) else record + piece
        if kind in (FULL, LAST):
            parsed = Record()
            parsed.ParseFromString(record)
            yield parsed


def wandb_runs(run_dir: Path) -> list[list]:
    """The records of each W&B offline run in the run directory, the first run first."""
    return [list(wandb_records(path)) for path in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))]


def wandb_history(run_dir: Path) -> list[tuple[int, dict[str, float]]]:
    """Each history row W&B holds of the run directory's run, as (step, metrics), in order."""
    rows = []
    for records in wandb_runs(run_dir):
        for record in records:
            if record.WhichOneof("record_type") == "history":
                # W&B keeps a name with a slash as its parts
                items = {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item
                }
                rows.append((record.history.step.num, {k: v for k, v in items.items() if not k.startswith("_")}))
    return rows


def mlflow_history(tracking_uri: str, run_id: str) -> list[tuple[int, str, float]]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    keys = client.get_run(run_id).data.metrics
    return [(m.step, m.key, m.value) for key in keys for m in client.get_metric_history(run_id, key)]


def tensorboard_history(run_dir: Path) -> dict[int, dict[str, float]]:
    events = EventAccumulator(str(RunDir(run_dir).tensorboard))
    events.Reload()
    steps: dict[int, dict[str, float]] = {}
    for tag in events.Tags()["scalars"]:
        for event in events.Scalars(tag):
            assert tag not in steps.setdefault(event.step, {}), f"TensorBoard holds {tag} at {event.step} twice"
            steps[event.step][tag] = event.value
    return steps


def same_figures(tracker: dict[int, dict[str, float]], tensorboard: dict[int, dict[str, float]]) -> None:
    """The tracker holds TensorBoard's names at TensorBoard's steps, with its values (in float32,
    as TensorBoard keeps them), timings aside: a replayed step takes its own time."""
    assert {step: sorted(names) for step, names in tracker.items()} == {
        step: sorted(names) for step, names in tensorboard.items()
    }
    for step, figures in tensorboard.items():
        for name, value in figures.items():
            if not name.startswith("time/"):
                assert tracker[step][name] == pytest.approx(value, rel=1e-6, abs=1e-6), (step, name)


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """W&B offline, its settings, cache and data under the test's directory."""
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    for variable in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(variable, str(tmp_path / "wandb-home"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    yield
    wandb.teardown()  # W&B keeps its settings (offline mode) process-wide until torn down


@pytest.mark.slow
def test_a_run_and_its_resume_log_the_same_scalars_to_tensorboard_wandb_and_mlflow_once(
    tiny_model_dir, tmp_path, offline_wandb
):
    pytest.importorskip("mlflow")
    run_dir, tracking_uri = tmp_path / "run", f"sqlite:///{tmp_path / 'mlflow.db'}"
    overrides = [
        *TINY,
        "steps=3",
        f"model={tiny_model_dir}",
        f"run_dir={run_dir}",
        "logging.wandb.project=selfplay-tests",
        "logging.wandb.mode=offline",
        f"logging.mlflow.tracking_uri={tracking_uri}",
    ]
    config = load_config(None, overrides)
    Trainer(config, progress=False).run()
    # Killed after logging step 3 and before its checkpoint: the resume replays step 3.
    shutil.rmtree(RunDir(run_dir).checkpoints / "step-000003")
    resume(run_dir, ["steps=4"])

    tensorboard = tensorboard_history(run_dir)
    assert sorted(tensorboard) == [1, 2, 3, 4] and "reward/mean" in tensorboard[1]
    saved = json.loads(RunDir(run_dir).trackers.read_text())
    assert saved["logged_through"] == 4

    runs = wandb_runs(run_dir)
    assert len(runs) == 2  # the run and its resume, one W&B run: the same id, the second resuming it
    first, second = ([r.run for r in records if r.WhichOneof("record_type") == "run"][0] for records in runs)
    assert first.run_id == second.run_id == saved["run_ids"]["wandb"] and second.resume
    history = wandb_history(run_dir)
    assert [step for step, _ in history] == [1, 2, 3, 4]
    same_figures(dict(history), tensorboard)
    attached = {item.key: json.loads(item.value_json) for item in second.config.update if item.key != "_wandb"}
    assert attached == config_to_dict(load_config(None, [*overrides, "steps=4"]))

    points = mlflow_history(tracking_uri, saved["run_ids"]["mlflow"])
    assert max(Counter((step, name) for step, name, _ in points).values()) == 1
    logged: dict[int, dict[str, float]] = {}
    for step, name, value in points:
        logged.setdefault(step, {})[name] = value
    same_figures(logged, tensorboard)
    from mlflow import MlflowClient

    run = MlflowClient(tracking_uri).get_run(saved["run_ids"]["mlflow"])
    assert run.data.params == {key: str(value) for key, value in settings_by_key(config).items()}
    assert run.info.status == "FINISHED"


@pytest.mark.slow
@pytest.mark.parametrize("asked", [[], ["wandb"], ["mlflow"]], ids=["neither", "wandb", "mlflow"])
def test_only_the_trackers_asked_for_are_imported(tmp_path, offline_wandb, asked):
    pytest.importorskip("mlflow")
    overrides = {
        "wandb": ["logging.wandb.project=selfplay-tests", "logging.wandb.mode=offline"],
        "mlflow": [f"logging.mlflow.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"],
    }
    chosen = [f"run_dir={tmp_path / 'run'}", *(o for name in asked for o in overrides[name])]
    script = (
        "import sys\n"
        "from selfplay.config import load_config\n"
        "import selfplay.train\n"
        "from selfplay.tracking import open_trackers\n"
        f"trackers = open_trackers(load_config(None, {chosen!r}), 0, resume=False)\n"
        "trackers.log({'reward/mean': 0.5}, 1)\n"
        "trackers.close()\n"
        "print(sorted(name for name in ('wandb', 'mlflow') if name in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == str(sorted(asked))


def test_without_trackers_a_run_logs_nowhere(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    trackers = open_trackers(load_config(None, [f"run_dir={run_dir}", "logging.tensorboard=false"]), 0, resume=False)
    trackers.log({"reward/mean": 0.5}, 1)
    trackers.close()
    assert list(run_dir.iterdir()) == []


@pytest.mark.parametrize("setting", ["logging.wandb.project=p", "logging.mlflow.tracking_uri=sqlite:///m.db"])
def test_a_tracker_that_is_not_installed_is_one_error_naming_the_extra_before_the_run_starts(
    tmp_path, monkeypatch, setting
):
    module = setting.split(".")[1]
    monkeypatch.setitem(sys.modules, module, None)  # an import of it fails, as where it is not installed
    config = load_config(None, [f"run_dir={tmp_path / 'run'}", setting])
    with pytest.raises(
        UserError, match=rf"asks for {module}, which is not installed: pip install 'selfplay\[trackers\]'"
    ):
        Trainer(config)
    assert not (tmp_path / "run").exists()  # refused before the model loads or the run directory is made


def test_a_tracker_that_refuses_its_settings_is_one_error_naming_the_fix(tmp_path, monkeypatch):
    """W&B online without a login, and an MLflow store of no known kind: what the service says,
    in one line, with what to change."""
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: no W&B login
    for variable in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    pytest.importorskip("wandb").teardown()  # settings an earlier W&B run in this process left
    for setting, fix in (
        (
            "logging.wandb.project=p",
            r"No API key configured.*\. Log in \(`wandb login`\), set logging.wandb.mode=offline",
        ),
        (
            "logging.mlflow.tracking_uri=nosuch://x",
            r"unsupported URI 'nosuch://x'.*\. Check logging.mlflow.tracking_uri",
        ),
    ):
        config = load_config(None, [f"run_dir={tmp_path / 'run'}", setting])
        with pytest.raises(UserError, match=fix) as refused:
            open_trackers(config, 0, resume=False)
        assert "\n" not in str(refused.value) and ".." not in str(refused.value)


def test_wandb_and_mlflow_settings_without_their_tracker_are_refused():
    with pytest.raises(UserError, match="logging.wandb.entity and logging.wandb.mode need logging.wandb.project"):
        load_config(None, ["logging.wandb.mode=offline"])
    with pytest.raises(UserError, match="logging.mlflow.experiment needs logging.mlflow.tracking_uri"):
        load_config(None, ["logging.mlflow.experiment=mine"])


def test_mlflow_names_change_only_the_characters_mlflow_refuses():
    assert mlflow_name("vs/mcts:50/win") == "vs/mcts:50/win"
    assert mlflow_name("eval/kuhn_poker/random/mean_return") == "eval/kuhn_poker/random/mean_return"
    assert mlflow_name("league/rating/main@000010") == "league/rating/main_000010"
    assert mlflow_name("vs/openspiel:goofspiel(num_cards=4)/win") == "vs/openspiel:goofspiel_num_cards_4_/win"


class FakeTracker:
    """A tracker that keeps the steps it is given, and fails from `failing_at` on, as a store on a
    full disk does (MLflow's error, raised from SQLite's)."""

    def __init__(self, failing_at: float = math.inf):
        self.steps, self.failing_at, self.closed = [], failing_at, False

    def log(self, metrics, step):
        if step >= self.failing_at:
            try:
                raise sqlite3.OperationalError("database or disk is full")
            except sqlite3.OperationalError as err:
                raise RuntimeError("(raised as a result of Query-invoked autoflush)\n[SQL: INSERT ...]") from err
        self.steps.append(step)

    def close(self):
        self.closed = True


def fake_trackers(tmp_path, on_failure: str, failing_at: int) -> tuple[Trackers, FakeTracker, FakeTracker]:
    trackers = Trackers(RunDir(tmp_path), {"wandb": "w", "mlflow": "m"}, 0, on_failure)
    wandb, mlflow = FakeTracker(), FakeTracker(failing_at)
    trackers.observers.update(wandb=wandb, mlflow=mlflow)
    return trackers, wandb, mlflow


def test_a_tracker_failing_mid_run_is_given_up_with_one_warning_and_the_steps_it_missed_said_at_the_end(
    tmp_path, capsys
):
    trackers, wandb, mlflow = fake_trackers(tmp_path, "continue", failing_at=2)
    for step in (1, 2, 3, 3, 4):  # an evaluation's figures come at the step's own
        trackers.log({"reward/mean": 0.5}, step)
    assert wandb.steps == [1, 2, 3, 3, 4] and mlflow.steps == [1]
    warned = capsys.readouterr().err
    assert warned.count("warning:") == 1
    assert "MLflow could not log step 2 (database or disk is full) and gets no more of this run's steps" in warned
    trackers.close()
    assert wandb.closed and not mlflow.closed  # a closing call to a failed store would fail again
    said = capsys.readouterr().err
    assert said == "warning: MLflow did not get steps 2-4 of this run (3 logged steps): database or disk is full.\n"
    assert json.loads(RunDir(tmp_path).trackers.read_text())["logged_through"] == 4


def test_a_tracker_failing_mid_run_stops_it_when_the_config_says_so(tmp_path, capsys):
    trackers, wandb, mlflow = fake_trackers(tmp_path, "stop", failing_at=2)
    trackers.log({"reward/mean": 0.5}, 1)
    with pytest.raises(TrackerFailed, match="MLflow could not log step 2: database or disk is full. Check logging"):
        trackers.log({"reward/mean": 0.5}, 2)
    trackers.close()
    assert wandb.closed and not mlflow.closed and capsys.readouterr().err == ""  # the error says it all
    assert load_config(None, ["logging.on_tracker_failure=stop"]).logging.on_tracker_failure == "stop"


def test_a_tracker_that_fails_to_close_is_said_and_the_others_close(tmp_path, capsys):
    trackers, wandb, mlflow = fake_trackers(tmp_path, "continue", failing_at=9)
    mlflow.close = lambda: FakeTracker(failing_at=0).log({}, 0)
    trackers.close()
    assert wandb.closed
    assert capsys.readouterr().err == "warning: MLflow could not close its run: database or disk is full.\n"


@pytest.mark.slow
def test_mlflow_gives_up_on_a_server_that_is_gone_within_seconds(tmp_path, monkeypatch):
    """MLflow's own settings retry for about 8 minutes; the user's settings, where given, hold."""
    pytest.importorskip("mlflow")
    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "7")
    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    config = load_config(None, [f"run_dir={tmp_path / 'run'}", f"logging.mlflow.tracking_uri=http://127.0.0.1:{port}"])
    started = time.monotonic()
    with pytest.raises(UserError, match="MLflow could not start this run's log: .*Connection refused"):
        open_trackers(config, 0, resume=False)
    assert time.monotonic() - started < 30
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2" and os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "7"


@pytest.mark.slow
def test_the_mlflow_store_the_hint_names_is_one_mlflow_accepts(tmp_path):
    pytest.importorskip("mlflow")
    stores = re.findall(r"\w+:///\S*?(?=[),])", TRACKER_FIXES["mlflow"])
    assert stores == ["sqlite:///PATH"]  # file:// stores are refused by MLflow 3
    uri = stores[0].replace("PATH", str(tmp_path / "mlflow.db"))
    config = load_config(
        None, [f"run_dir={tmp_path}", "logging.tensorboard=false", f"logging.mlflow.tracking_uri={uri}"]
    )
    open_trackers(config, 0, resume=False).close()
