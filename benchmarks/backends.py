"""The main job on each backend, end to end: which backend trains fastest on this machine, and
what share of a step weight sync takes on each (target: under 2%).

Trains a config (the README's main job by default) for a few steps with each backend, each in its
own process, from the same model and seed, without evaluation. Printed for each backend: the
mean step time and games/s over whole steps (the first step left out: engines start and compile
then), the share of step time spent generating (playing the games), learning, syncing weights
to the backend and recording the league's results, and sampled tokens/s while generating.

    python benchmarks/backends.py [--config configs/quickstart.yaml] [--steps 6] [--backends hf vllm]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
from concurrent.futures import ProcessPoolExecutor

PARTS = ("time/generate_s", "time/learn_s", "time/sync_s", "time/league_s")


def train(config_path: str, backend: str, steps: int, overrides: list[str]) -> list[dict[str, float]]:
    """Each step's time metrics (as the run logs them to TensorBoard), training `steps` steps on
    `backend`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from selfplay.config import load_config
    from selfplay.run_dir import RunDir
    from selfplay.train import Trainer

    with tempfile.TemporaryDirectory() as run_dir:
        config = load_config(
            config_path,
            [f"backend={backend}", f"run_dir={run_dir}", f"steps={steps}", f"checkpoint_every={steps}", "eval.every=0"]
            + overrides,
        )
        Trainer(config, progress=False).run()
        events = EventAccumulator(str(RunDir(run_dir).tensorboard))
        events.Reload()
        by_tag = {tag: [event.value for event in events.Scalars(tag)] for tag in (*PARTS, "time/tokens_per_s")}
    return [
        {**{tag: values[i] for tag, values in by_tag.items()}, "games": config.rollout.games_per_step}
        for i in range(steps)
    ]


def summary(backend: str, rows: list[dict[str, float]]) -> float:
    timed = rows[1:] if len(rows) > 1 else rows
    total = sum(r[part] for r in timed for part in PARTS)
    shares = [sum(r[part] for r in timed) / total for part in PARTS]
    print(
        f"{backend:8s}  {total / len(timed):7.2f}  {sum(r['games'] for r in timed) / total:8.1f}  "
        + "  ".join(f"{share:8.1%}" for share in shares)
        + f"  {statistics.mean(r['time/tokens_per_s'] for r in timed):8.0f}"
    )
    return total / len(timed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/quickstart.yaml")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--backends", nargs="+", default=["hf", "vllm"])
    parser.add_argument("overrides", nargs="*", help="key=value settings for both runs")
    args = parser.parse_args()

    step_s = {}
    print(f"{args.config}, {args.steps} steps (the first left out) {' '.join(args.overrides)}\n")
    print(f"{'backend':8s}  {'step s':>7s}  {'games/s':>8s}  {'generate':>8s}  {'learn':>8s}  {'sync':>8s}  "
          f"{'league':>8s}  {'tok/s':>8s}")  # fmt: skip
    for backend in args.backends:
        # Not a multiprocessing.Pool: its daemonic workers cannot start vLLM's engine processes.
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            rows = pool.submit(train, args.config, backend, args.steps, args.overrides).result()
        step_s[backend] = summary(backend, rows)
    fastest = min(step_s, key=step_s.get)
    others = ", ".join(f"{step_s[b] / step_s[fastest]:.2f}x the step time on {b}" for b in step_s if b != fastest)
    print(f"\nfastest end to end: {fastest}" + (f" ({others})" if others else ""))


if __name__ == "__main__":
    main()
