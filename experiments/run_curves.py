"""Plot scalars of one or more runs by training step, from their TensorBoard logs.

    python experiments/run_curves.py runs/smollm2_proposer_solver \
        --metrics solver_accuracy distinct_proposals valid_rate --out curves.png

Each metric is matched by the end of its tag (`solver_accuracy` finds
`game/GAME/solver_accuracy`), so one name covers the same figure in every game of a run; a
metric may also be a whole tag. One panel per metric, one line per run and matching tag, and a
rolling mean (`--smooth` steps) over the raw values, which are drawn faintly.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar a run logged, by tag, as (step, value) pairs."""
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def matching(tags: list[str], metric: str) -> list[str]:
    return [tag for tag in tags if tag == metric or tag.endswith("/" + metric)]


def rolling_mean(values: np.ndarray, window: int) -> np.ndarray:
    return np.array([values[max(0, i - window + 1) : i + 1].mean() for i in range(len(values))])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories")
    parser.add_argument("--metrics", nargs="+", required=True, help="tag endings, e.g. solver_accuracy")
    parser.add_argument("--smooth", type=int, default=5, help="steps in the rolling mean (default 5)")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args()
    logged = {run: scalars(run) for run in args.runs}
    figure, axes = plt.subplots(1, len(args.metrics), figsize=(4.5 * len(args.metrics), 3.4), squeeze=False)
    for ax, metric in zip(axes[0], args.metrics):
        for run, series in logged.items():
            for tag in matching(list(series), metric):
                steps, values = map(np.array, zip(*series[tag]))
                (line,) = ax.plot(steps, rolling_mean(values, args.smooth), label=run.name)
                ax.plot(steps, values, color=line.get_color(), alpha=0.25, linewidth=0.8)
        ax.set_title(metric)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(args.out, dpi=110)
    print(f"Wrote {args.out}")


if __name__ == "__main__":
    main()
