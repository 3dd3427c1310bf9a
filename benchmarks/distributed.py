"""Rollouts on Ray against rollouts in the trainer's process, on the same work.

Trains the same self-play run (the default model's shape, TicTacToe, legal decoding, so games
last their natural length) under each setup and prints, per setup: start-up (Ray, workers,
models), the first step (warm-up) and then the means of the steps after it: games/s and
tokens/s of the rollouts and of whole steps, the split wait-for-rollouts / learn / sync, the
weight-sync bytes and seconds, the speedup of rollouts (games/s) and of whole steps against the
run without Ray and the rollouts' efficiency (speedup / workers), Ray's overhead (one worker
against none), and with max_staleness 1 the share of generation that ran while the learner
updated. Only one worker plays the very games of the run without Ray: with more, the step's
games are split otherwise and sample other responses (`tokens` a step), so the learner's share
of a step differs with the games, not with Ray.

Setups: no Ray; local Ray with 1, 2 and 4 workers; 2 workers on a fake 2-node cluster
(`ray.cluster_utils.Cluster`); 2 workers with max_staleness 1; 2 workers sent their weights by
broadcast (gloo, or NCCL with a learner on a GPU) instead of the object store. Each worker asks
for the machine's cores divided by the workers, which are its torch threads.

    python benchmarks/distributed.py [--model PATH] [--steps 4] [--games-per-step 64]
    python benchmarks/distributed.py --device cuda --worker-gpus 1 --only "2 workers, broadcast"

NCCL needs the learner and each worker on GPUs of their own.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import ray
from ray.cluster_utils import Cluster

from selfplay.config import load_config
from selfplay.train import Trainer
from selfplay.untrained_model import build_untrained

CORES = os.cpu_count() or 1


# (name, rollout workers, further overrides, on a fake 2-node cluster)
SETUPS = [
    ("no Ray", 0, [], False),
    ("Ray, 1 worker", 1, [], False),
    ("Ray, 2 workers", 2, [], False),
    ("Ray, 4 workers", 4, [], False),
    ("2 workers, 2 fake nodes", 2, [], True),
    ("2 workers, max_staleness 1", 2, ["distributed.max_staleness=1"], False),
    ("2 workers, broadcast", 2, ["distributed.weight_sync=collective"], False),
]


def overrides_for(workers: int, extra: list[str]) -> list[str]:
    if not workers:
        return extra
    return [f"distributed.rollout_workers={workers}", f"distributed.worker_cpus={CORES / workers:g}", *extra]


def measure(model: str, overrides: list[str], steps: int, games: int, run_dir: Path) -> dict:
    config = load_config(
        None,
        [
            f"model={model}",
            f"run_dir={run_dir}",
            f"steps={steps}",
            f"checkpoint_every={steps}",
            "games={tictactoe: 1}",
            "opponents={self: 1}",
            f"rollout.games_per_step={games}",
            "rollout.decoding=legal",
            "rollout.max_new_tokens=8",
            *overrides,
        ],
    )
    started = time.perf_counter()
    trainer = Trainer(config, progress=False)
    startup = time.perf_counter() - started
    rows, step = [], trainer.train_step  # whole steps, timed; the checkpoint at the end is not one

    def timed_step():
        begun = time.perf_counter()
        metrics = step()
        metrics["step_s"] = time.perf_counter() - begun
        rows.append(metrics)
        return metrics

    trainer.train_step = timed_step
    trainer.run()
    return {"startup": startup, "warmup": rows[0]["step_s"], "rows": rows[1:]}


def summary(result: dict, games: int) -> dict[str, float]:
    rows = result["rows"]

    def mean(key: str) -> float:
        return float(np.mean([row.get(key, 0.0) for row in rows]))

    tokens = mean("time/tokens_per_s") * mean("time/generate_s")
    play = mean("distributed/play_s") or mean("time/generate_s")
    return {
        "startup_s": result["startup"],
        "warmup_s": result["warmup"],
        "step_s": mean("step_s"),
        "wait_s": mean("time/generate_s"),
        "play_s": play,
        "learn_s": mean("time/learn_s"),
        "sync_s": mean("time/sync_s") + mean("distributed/worker_load_s"),
        "sync_mb": mean("distributed/sync_mb"),
        "rollout_games_s": games / play,
        "rollout_tokens_s": tokens / play,
        "step_games_s": games / mean("step_s"),
        "step_tokens_s": tokens / mean("step_s"),
        "tokens": tokens,
        "hidden": 1 - mean("time/generate_s") / play if "distributed/play_s" in rows[0] else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a model name or directory (default: the default model's shape, untrained)")
    parser.add_argument("--steps", type=int, default=4, help="steps per setup; the first is the warm-up")
    parser.add_argument("--games-per-step", type=int, default=64)
    parser.add_argument("--only", nargs="+", metavar="SETUP", help="these setups (and no Ray), by name")
    parser.add_argument("--device", help="the learner's device (cuda on a GPU machine; the broadcast is then NCCL)")
    parser.add_argument("--worker-gpus", type=float, default=0.0, help="GPUs each rollout worker asks for")
    args = parser.parse_args()
    chosen = [setup for setup in SETUPS if setup[0] == "no Ray" or not args.only or setup[0] in args.only]
    devices = [f"device={args.device}"] if args.device else []
    devices += [f"distributed.worker_gpus={args.worker_gpus:g}"] if args.worker_gpus else []
    scratch = Path(tempfile.mkdtemp(prefix="selfplay-bench-"))
    model = args.model or str(build_untrained(scratch / "model"))
    results = {}
    for index, (name, workers, extra, two_nodes) in enumerate(chosen):
        cluster = None
        if two_nodes:
            cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
            for _ in range(2):
                cluster.add_node(num_cpus=CORES // 2 or 1)
            ray.init(address=cluster.address, log_to_driver=False)
        try:
            run_dir = scratch / f"run{index}"
            overrides = [*devices, *overrides_for(workers, extra)]
            result = measure(model, overrides, args.steps, args.games_per_step, run_dir)
        finally:
            if cluster is not None:
                ray.shutdown()
                cluster.shutdown()
        results[name] = summary(result, args.games_per_step)
        print(f"{name}: done", flush=True)

    base = results["no Ray"]
    print(f"\n{CORES} cores; {args.games_per_step} games a step, {args.steps - 1} steps measured after a warm-up step")
    header = (
        f"{'setup':28} {'start s':>7} {'warm s':>6} {'step s':>6} {'wait':>5} {'learn':>5} {'sync':>5} "
        f"{'MB':>5} {'tokens':>6} {'roll g/s':>8} {'roll tok/s':>10} {'step g/s':>8} {'roll x':>6} {'effic.':>6} "
        f"{'step x':>6} {'hidden':>6}"
    )
    print(header)
    for name, workers, _, _ in chosen:
        row = results[name]
        speedup = row["rollout_games_s"] / base["rollout_games_s"]
        hidden = f"{row['hidden']:6.2f}" if "staleness" in name else f"{'-':>6}"
        print(
            f"{name:28} {row['startup_s']:7.1f} {row['warmup_s']:6.1f} {row['step_s']:6.2f} {row['wait_s']:5.2f} "
            f"{row['learn_s']:5.2f} {row['sync_s']:5.2f} {row['sync_mb']:5.1f} {row['tokens']:6.0f} "
            f"{row['rollout_games_s']:8.1f} {row['rollout_tokens_s']:10.0f} {row['step_games_s']:8.1f} {speedup:6.2f} "
            f"{speedup / max(workers, 1):6.2f} {base['step_s'] / row['step_s']:6.2f} {hidden}"
        )
    print()
    if "Ray, 1 worker" in results:
        one = results["Ray, 1 worker"]
        # One worker plays the very games the trainer would (the same records), and the learner's
        # work is the same: Ray's cost is what the rollout and sync phases take beyond no Ray's.
        extra = one["wait_s"] + one["sync_s"] - base["wait_s"] - base["sync_s"]
        print(
            f"Ray's overhead, 1 worker against no Ray: {extra:+.2f} s a step, {extra / base['step_s']:+.1%} of its "
            f"step time (target <= 10%); whole steps {one['step_s']:.2f} s against {base['step_s']:.2f} s"
        )
    for name, row in results.items():
        if row["sync_mb"]:
            print(f"weight sync, {name}: {row['sync_s']:.3f} s a step, {row['sync_s'] / row['step_s']:.1%} of it")
    if "2 workers, max_staleness 1" in results:
        stale = results["2 workers, max_staleness 1"]
        print(f"max_staleness 1: {stale['hidden']:.0%} of generation ran while the learner updated")
    if CORES <= 2:
        print(f"On {CORES} cores the workers share them with each other and the learner: only overhead and overlap")
        print("mean much here; speedup and efficiency need a core (or a GPU) per worker.")


if __name__ == "__main__":
    main()
