"""Rollouts in Ray actors: the same records as a run without Ray, streamed weights by object store
and by broadcast, bounded staleness, and workers that die mid-step (killed, or their node removed).

Every run here is a league (snapshots, a main and a league exploiter, a scripted agent), so
that learning players, snapshots and scripted seats all reach the workers.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import tempfile

import pytest
import torch

ray = pytest.importorskip("ray")

# Ray clusters and several learner processes each want the cores to themselves: one worker runs them all.
pytestmark = [pytest.mark.xdist_group("whole_machine"), pytest.mark.slow]

from selfplay.backends import SamplingSettings, save_weights  # noqa: E402
from selfplay.config import DistributedConfig, load_config  # noqa: E402
from selfplay.distributed import weight_sync, worker_pool  # noqa: E402
from selfplay.distributed.cluster import check_resources, connect  # noqa: E402
from selfplay.distributed.rollout_worker import RolloutWorker  # noqa: E402
from selfplay.distributed.worker_pool import RolloutWorkers, WorkerKeepsFailing  # noqa: E402
from selfplay.errors import UserError  # noqa: E402
from selfplay.league.store import LeagueStore  # noqa: E402
from selfplay.rollouts import MatchSpec, RolloutSettings  # noqa: E402
from selfplay.run_dir import RunDir  # noqa: E402
from selfplay.train import Trainer  # noqa: E402
from tests.test_hf_backend import learner_weights  # noqa: E402
from tests.test_league import LEAGUE  # noqa: E402

GAMES_PER_STEP = 6
LEARNING_PLAYERS = 3  # the main player, a main exploiter and a league exploiter
# Two steps, with a snapshot after the first, so that the second step seats a snapshot too: each
# fault below strikes in the last step, and staleness plays it ahead.
STEPS = 2
RAY_LEAGUE = [*LEAGUE, f"steps={STEPS}", "league.snapshot_every=1"]


def ensure_local_ray() -> None:
    """One local Ray instance, started by the first test that needs it and kept for the next
    (the fake-cluster test alone replaces it with its own)."""
    if not ray.is_initialized():
        connect(DistributedConfig(rollout_workers=2))


@pytest.fixture
def local_ray():
    ensure_local_ray()


@pytest.fixture(scope="module", autouse=True)
def no_ray_after_this_module():
    """Ray's processes would otherwise run beside every later test."""
    yield
    ray.shutdown()


def train(tiny_model_dir, run_dir, overrides=(), after_submit=None, resume=False) -> tuple[list[bytes], dict]:
    """Train a small league; returns each step's records (pickled, in a fixed order) and the
    last step's metrics. `after_submit(trainer, step)` runs once a step's games are handed out."""
    config = load_config(None, [*RAY_LEAGUE, f"model={tiny_model_dir}", f"run_dir={run_dir}", *overrides])
    trainer = Trainer(config, resume=resume, progress=False)
    steps = []
    record = trainer._league_step

    def recorded(trajectories, versions, *rest):
        ordered = sorted(trajectories, key=lambda t: (t.result.owner, t.result.seed, t.result.game, t.result.players))
        steps.append(pickle.dumps(ordered))
        return record(trajectories, versions, *rest)

    trainer._league_step = recorded
    if after_submit is not None:
        submit = trainer.workers.submit

        def submitted(step, *args):
            submit(step, *args)
            after_submit(trainer, step)

        trainer.workers.submit = submitted
    return steps, trainer.run()


def assert_store_holds_every_game_once(run_dir, steps=STEPS):
    with LeagueStore(RunDir(run_dir).league_store, read_only=True) as store:
        matches = store.matches()
    keys = [(m.step, m.game, m.seed, m.players) for m in matches]
    assert len(keys) == len(set(keys))
    assert sorted({m.step for m in matches}) == list(range(1, steps + 1))
    for step in range(1, steps + 1):
        assert sum(m.step == step for m in matches) == GAMES_PER_STEP * LEARNING_PLAYERS


@pytest.fixture(scope="module")
def two_workers(tiny_model_dir, tmp_path_factory):
    """A clean run on two workers, the reference the runs with faults must reproduce."""
    ensure_local_ray()
    return train(tiny_model_dir, tmp_path_factory.mktemp("two"), ["distributed.rollout_workers=2"])[0]


def test_ray_missing_unreachable_or_too_small_is_one_clear_error(monkeypatch):
    if ray.is_initialized():
        ray.shutdown()
    one = DistributedConfig(rollout_workers=1, address="127.0.0.1:1")
    with pytest.raises(UserError, match=r"Cannot reach the Ray cluster at '127.0.0.1:1'.*ray start --head"):
        connect(one)
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "ray", None)
        with pytest.raises(UserError, match=r"needs Ray.*pip install 'selfplay\[distributed\]'"):
            connect(one)
    nodes = [{"Alive": True, "Resources": {"CPU": 2.0}}, {"Alive": False, "Resources": {"CPU": 8.0, "GPU": 1.0}}]
    with pytest.raises(UserError, match=r"place 3 rollout workers asking 1 CPU each \(distributed.worker_cpus\)"):
        check_resources(DistributedConfig(rollout_workers=3), nodes)
    with pytest.raises(UserError, match=r"asking 0.5 GPU.*distributed.worker_gpus.*have 0 GPU"):
        check_resources(DistributedConfig(rollout_workers=1, worker_gpus=0.5), nodes)
    check_resources(DistributedConfig(rollout_workers=4, worker_cpus=0.5), nodes)
    with pytest.raises(UserError, match="distributed.rollout_workers to 1 or more"):
        load_config(None, ["distributed.max_staleness=1"])


def test_a_local_ray_starts_beside_the_stale_address_of_a_killed_cluster(monkeypatch):
    if ray.is_initialized():
        ray.shutdown()
    # Ray's temp dir, short: its sockets live there and a Unix socket's path has at most 107 bytes.
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="ray") as temp_dir:
        monkeypatch.setenv("RAY_TMPDIR", temp_dir)
        stale = os.path.join(temp_dir, "ray", "ray_current_cluster")
        os.makedirs(os.path.dirname(stale))
        with open(stale, "w") as file:
            file.write("127.0.0.1:1")  # what a cluster killed before its shutdown leaves behind
        try:
            assert connect(DistributedConfig(rollout_workers=1))
            assert [node["Alive"] for node in ray.nodes()] == [True]
        finally:
            ray.shutdown()


class InspectedWorker(RolloutWorker):
    """A rollout worker that also hands over the weights it serves."""

    def served(self, name: str) -> dict[str, torch.Tensor]:
        backend = self.policies.get(name) or self.snapshots[name]
        return {key: tensor.clone() for key, tensor in backend.model.state_dict().items()}


@pytest.mark.parametrize("sync", ["object_store", "collective"])
def test_workers_serve_a_streamed_policy_and_a_snapshot_by_either_path(
    tiny_model_dir, tmp_path, local_ray, monkeypatch, sync
):
    monkeypatch.setattr(worker_pool, "RolloutWorker", InspectedWorker)
    monkeypatch.setattr(weight_sync, "WEIGHT_BUCKET_BYTES", 1 << 20)  # many buckets, as a large model sends
    policy, snapshot = learner_weights(tiny_model_dir, seed=1), learner_weights(tiny_model_dir, seed=2)
    workers = RolloutWorkers(
        DistributedConfig(rollout_workers=1, weight_sync=sync),
        str(tiny_model_dir),
        "hf",
        "fp32",
        RolloutSettings(),
        learner_device=torch.device("cpu"),
        current_weights=lambda name: policy,
        device="cpu",
    )
    try:
        workers.publish("main", iter(policy.items()), version=1)  # read once, as a sharded learner streams
        weight_bytes = sum(tensor.numel() * tensor.element_size() for tensor in policy.values())
        assert weight_bytes <= workers.take_published_bytes() < 1.01 * weight_bytes
        assert workers.take_published_bytes() == 0
        workers.add_snapshot("main@0", save_weights(snapshot, tmp_path / "snapshot.safetensors"), version=0)
        match = MatchSpec("kuhn_poker", ("main", "main@0"), seed=0, owner="main")
        workers.submit(1, [match], SamplingSettings(max_new_tokens=8), ["main"])
        assert workers.collect(1).versions == {"main": 1, "main@0": 0}
        for name, weights in (("main", policy), ("main@0", snapshot)):
            served = ray.get(workers.workers[0].served.remote(name))
            for key, tensor in weights.items():
                assert torch.equal(served[key], tensor), (name, key)
            assert torch.equal(served["lm_head.weight"], weights["model.embed_tokens.weight"])  # tied
    finally:
        workers.close()


@pytest.fixture
def one_thread():
    """A worker's torch uses `distributed.worker_cpus` threads (1 here): the run without Ray uses as
    many, since torch's CPU kernels may split a sum differently with another number of threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_one_worker_gives_byte_identical_records_to_a_run_without_ray(tiny_model_dir, tmp_path, local_ray, one_thread):
    # Without exploiters: in one process a LoRA exploiter samples through its adapters, a
    # worker through the merged weights, and their log-probs differ in the last bit.
    snapshots_and_scripted = ["league.main_exploiters=0", "league.league_exploiters=0"]
    without, metrics = train(tiny_model_dir, tmp_path / "local", snapshots_and_scripted)
    with_ray, ray_metrics = train(
        tiny_model_dir, tmp_path / "ray", [*snapshots_and_scripted, "distributed.rollout_workers=1"]
    )
    assert len(without) == STEPS
    assert with_ray == without
    assert any("@" in player for t in pickle.loads(with_ray[-1]) for player in t.result.players)  # a snapshot
    # A run resumed from its step-1 checkpoint sends the checkpoint's weights to its worker.
    on_one = [*snapshots_and_scripted, "distributed.rollout_workers=1"]
    train(tiny_model_dir, tmp_path / "resumed", [*on_one, "steps=1"])
    resumed, _ = train(tiny_model_dir, tmp_path / "resumed", [*on_one, f"steps={STEPS}"], resume=True)
    assert resumed == with_ray[1:]
    assert "distributed/version_lag_max" not in metrics
    assert ray_metrics["distributed/version_lag_max"] == 0
    assert ray_metrics["distributed/sync_mb"] > 0
    assert ray_metrics["league/snapshots"] == metrics["league/snapshots"]


@pytest.mark.slow
def test_a_worker_killed_mid_step_is_replaced_and_its_games_played_again(tiny_model_dir, tmp_path, two_workers):
    """Over a gloo broadcast, which the replacement joins, against the reference run's object
    store: the same weights reach the workers, so the same records come back."""

    def kill_worker_during_step_two(trainer, step):
        if step == 2:
            os.kill(trainer.workers.places[0][1], signal.SIGKILL)

    broadcast = ["distributed.rollout_workers=2", "distributed.weight_sync=collective"]
    steps, metrics = train(tiny_model_dir, tmp_path, broadcast, kill_worker_during_step_two)
    assert steps == two_workers  # replayed with the weights the step was first played with
    assert_store_holds_every_game_once(tmp_path)


def test_a_worker_that_keeps_failing_stops_the_run_naming_the_setting(tiny_model_dir, tmp_path, local_ray):
    def kill_every_worker(trainer, step):
        os.kill(trainer.workers.places[0][1], signal.SIGKILL)

    with pytest.raises(WorkerKeepsFailing, match=r"step 1 failed on 1 rollout workers.*max_worker_failures=1"):
        train(
            tiny_model_dir,
            tmp_path,
            ["distributed.rollout_workers=1", "distributed.max_worker_failures=1"],
            kill_every_worker,
        )


@pytest.mark.slow
def test_bounded_staleness_plays_ahead_within_one_version(tiny_model_dir, tmp_path, local_ray):
    steps, metrics = train(tiny_model_dir, tmp_path, ["distributed.rollout_workers=2", "distributed.max_staleness=1"])
    for step, records in enumerate(steps, start=1):
        for trajectory in pickle.loads(records):
            owner = trajectory.result.owner
            versions = {turn.policy_version for turn in trajectory.turns if turn.agent == owner}
            assert len(versions) <= 1  # each game is played by one version of its learner
            # The learner is at version step-1 when it trains on step's games: at most one behind.
            assert all(step - 2 <= version <= step - 1 for version in versions)
    assert metrics["distributed/version_lag_max"] == 1
    assert "learner/ratio_lag1" in metrics
    assert_store_holds_every_game_once(tmp_path)


@pytest.mark.slow
def test_a_node_removed_mid_step_loses_no_game(tiny_model_dir, tmp_path, two_workers):
    from ray.cluster_utils import Cluster

    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    nodes = [cluster.add_node(num_cpus=1) for _ in range(3)]  # room for two workers and one replacement
    try:
        ray.init(address=cluster.address, log_to_driver=False)

        def remove_a_workers_node(trainer, step):
            if step == 2:
                node_id = trainer.workers.places[0][0]
                cluster.remove_node(next(node for node in nodes if node.node_id == node_id))

        steps, metrics = train(tiny_model_dir, tmp_path, ["distributed.rollout_workers=2"], remove_a_workers_node)
        assert steps == two_workers
        assert_store_holds_every_game_once(tmp_path)
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.vllm
@pytest.mark.slow
def test_a_vllm_worker_serves_each_new_version(tiny_model_dir, tmp_path, local_ray):
    pytest.importorskip("vllm")
    overrides = [
        "backend=vllm",
        "distributed.rollout_workers=1",
        "league.main_exploiters=0",
        "league.league_exploiters=0",
    ]
    steps, metrics = train(tiny_model_dir, tmp_path, overrides)
    for step, records in enumerate(steps, start=1):
        main_turns = [turn for t in pickle.loads(records) for turn in t.turns if turn.agent == "main"]
        assert main_turns and {turn.policy_version for turn in main_turns} == {step - 1}
    assert metrics["distributed/worker_load_s"] > 0
