"""What training did to the policy, read from the evaluations a run made as it went.

`selfplay train` evaluates the policy before its first step, every `eval.every` steps and after
its last (`Trainer.evaluate`), and appends each evaluation to the run directory's `eval.jsonl`,
one JSON object a line: the step, every figure (`eval/GAME/...` as in TensorBoard) and the 95%
interval of each figure that sampled games measure. From that file this module prints the
before/after table that ends a run and draws the learning curve (`learning_curve.png`).
"""

from __future__ import annotations

import json
import math
import textwrap
from dataclasses import dataclass
from pathlib import Path

from selfplay.evaluation.significance import (
    FALSE_VERDICTS_NOTE,
    HIGHER_IS_BETTER,
    LOWER_IS_BETTER,
    NEITHER_IS_BETTER,
    difference_interval,
    exact_verdict,
    sampled_verdict,
)
from selfplay.files import append_text, read_json_lines, replace_text


@dataclass(frozen=True)
class Evaluation:
    """One evaluation of the policy: `figures` by metric name, and the 95% interval of those
    that sampled games measure (the exact figures have none)."""

    step: int
    figures: dict[str, float]
    intervals: dict[str, tuple[float, float]]


def _line(evaluation: Evaluation) -> str:
    record = {"step": evaluation.step, "figures": evaluation.figures, "intervals": evaluation.intervals}
    return json.dumps(record, allow_nan=True) + "\n"


def append_evaluation(path: Path, evaluation: Evaluation) -> None:
    """Add `evaluation` to the log at `path`."""
    append_text(path, _line(evaluation), "the evaluation log")


def read_evaluations(path: Path) -> list[Evaluation]:
    """The evaluations logged at `path`, in order; none if it does not exist. A line that is not
    a whole evaluation (the last one of a run killed while writing it) is passed over."""
    evaluations = []
    for record in read_json_lines(path):
        try:
            evaluations.append(
                Evaluation(
                    int(record["step"]),
                    {str(k): float(v) for k, v in record["figures"].items()},
                    {str(k): (float(lo), float(hi)) for k, (lo, hi) in record["intervals"].items()},
                )
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
    return evaluations


def keep_evaluations_up_to(path: Path, step: int) -> None:
    """Drop the evaluations after `step` from the log: a run resumed from its step-`step`
    checkpoint evaluates those steps again."""
    if not path.exists():
        return
    replace_text(path, "".join(_line(e) for e in read_evaluations(path) if e.step <= step), "the evaluation log")


# -- the table ------------------------------------------------------------------------------------

# Figure name suffix -> how the table names it, in the order it lists them (milli-big-blinds, the
# mean return times 1000, are left to TensorBoard).
_LABELS = {
    "exact_non_loss": "non-loss vs random, exact (both seats)",
    "exact_non_loss_seat_0": "  as the first player, exact",
    "exact_non_loss_seat_1": "  as the second player, exact",
    "exploitability": "exploitability, exact",
    "wins_rate": "win rate",
    "draws_rate": "draw rate",
    "losses_rate": "loss rate",
    "mean_return": "mean return",
    "opponent_mean_return": "opponent's mean return",
    "invalid_move_rate": "invalid moves",
}
# Computed from every move's probability, with no sampling: judged by `exact_verdict`.
EXACT = ("exact_non_loss", "exact_non_loss_seat_0", "exact_non_loss_seat_1", "exploitability")
# Which way each figure is good; any other is better higher.
DIRECTIONS = {
    **dict.fromkeys(("exploitability", "losses_rate", "invalid_move_rate", "opponent_mean_return"), LOWER_IS_BETTER),
    "draws_rate": NEITHER_IS_BETTER,  # more draws may mean fewer wins
}
VERDICT_NOTE = (
    "Verdicts: a sampled figure is better or worse only when the 95% interval of its change (in brackets, "
    "combined from the two evaluations' intervals) leaves out 0, with no verdict where a figure has no interval; "
    "an exact figure by its sign. " + FALSE_VERDICTS_NOTE
)


# A role game's figures of what its roles did (`TextGame.outcome_figures`: attack success,
# leaks, a proposer's task validity, ...) are logged as `eval/GAME/OPPONENT/ROLE_FIGURES/FIGURE`
# and listed after the game's own; like draws, each is called higher or lower, not better or
# worse, since one role's gain (an attacker's success) is the other's loss.
ROLE_FIGURES = "role"


def _describe(name: str) -> tuple[str, str, int] | None:
    """`eval/GAME[/OPPONENT]/FIGURE` -> (game, label, rank in the table); None for a figure the
    table leaves out (times, truncation, response lengths)."""
    parts = name.split("/")
    if len(parts) == 5 and parts[0] == "eval" and parts[3] == ROLE_FIGURES:
        return parts[1], f"{parts[4].replace('_', ' ')} vs {parts[2]} (role figure)", len(_LABELS)
    if len(parts) < 3 or parts[0] != "eval" or parts[-1] not in _LABELS:
        return None
    game, figure = parts[1], parts[-1]
    label = _LABELS[figure] if len(parts) == 3 else f"{_LABELS[figure]} vs {'/'.join(parts[2:-1])}"
    return game, label, list(_LABELS).index(figure)


def change(before: Evaluation, after: Evaluation, name: str) -> tuple[float, list[float] | None, str]:
    """How figure `name` changed from `before` to `after`: the difference, its 95% interval (none
    for an exact figure) and the verdict (`significance`)."""
    difference = after.figures[name] - before.figures[name]
    figure = name.rsplit("/", 1)[-1]
    role_figure = name.split("/")[-2] == ROLE_FIGURES
    direction = NEITHER_IS_BETTER if role_figure else DIRECTIONS.get(figure, HIGHER_IS_BETTER)
    if figure in EXACT:
        return difference, None, exact_verdict(difference, direction)
    interval = difference_interval(
        before.figures[name], before.intervals.get(name), after.figures[name], after.intervals.get(name)
    )
    return difference, interval, sampled_verdict(difference, interval, direction)


def _value(value: float, interval: tuple[float, float] | None) -> str:
    if not math.isfinite(value):
        return "-"
    if interval is None:
        return f"{value:.3f}"
    return f"{value:.3f} [{interval[0]:.2f}, {interval[1]:.2f}]"


def _change(difference: float, interval: list[float] | None) -> str:
    if not math.isfinite(difference):
        return "-"
    # An exact change too small for three decimals still shows its sign and size.
    shown = f"{difference:+.1e}" if 0 < abs(difference) < 0.0005 else f"{difference:+.3f}"
    return shown if interval is None else f"{shown} [{interval[0]:+.2f}, {interval[1]:+.2f}]"


def evaluation_table(evaluations: list[Evaluation]) -> str:
    """The figures of the first and the last of `evaluations` (before and after training) side
    by side with the change and its verdict (`change`), grouped by game; sampled figures carry
    their 95% interval in brackets. With one evaluation, its figures alone."""
    shown = [evaluations[0], evaluations[-1]] if len(evaluations) > 1 else evaluations[:1]
    rows = []
    for name in shown[-1].figures:
        described = _describe(name)
        if described is not None and all(name in e.figures for e in shown):
            rows.append((described[0], described[2], described[1], name))
    rows.sort()
    header = ("game", "figure", *(f"step {e.step}" for e in shown))
    header += ("change", "verdict") if len(shown) == 2 else ()
    lines = [header]
    for game, _, label, name in rows:
        cells = [_value(e.figures[name], e.intervals.get(name)) for e in shown]
        if len(shown) == 2:
            difference, interval, verdict = change(*shown, name)
            cells += [_change(difference, interval), verdict]
        lines.append((game, label, *cells))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = []
    for i, line in enumerate(lines):
        if i > 1 and line[0] == lines[i - 1][0]:
            line = ("", *line[1:])
        out.append("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
        if i == 0:
            out.append("  ".join("-" * width for width in widths))
    if len(shown) == 2:
        out += ["", *textwrap.wrap(VERDICT_NOTE, 100)]
    return "\n".join(out)


# -- the plot -------------------------------------------------------------------------------------


# Left out of the plot: the draw and loss rates and each seat's figures (the table has them).
_NOT_PLOTTED = ("draws_rate", "losses_rate", "_seat_0", "_seat_1")


def plot_learning_curve(evaluations: list[Evaluation], path: Path) -> Path:
    """One panel per game: each figure of the table by step, sampled ones with their 95%
    interval as a band, its legend saying the table's verdict on the change from the first
    evaluation to the last. Written as a PNG to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves: dict[str, dict[str, str]] = {}  # game -> metric name -> label
    for name in evaluations[-1].figures:
        described = _describe(name)
        if described is not None and not name.endswith(_NOT_PLOTTED):
            label = described[1].strip()
            if len(evaluations) > 1 and name in evaluations[0].figures:
                label += f" ({change(evaluations[0], evaluations[-1], name)[2]})"
            curves.setdefault(described[0], {})[name] = label
    games = sorted(curves)
    figure, axes = plt.subplots(1, max(1, len(games)), figsize=(5.5 * max(1, len(games)), 4), squeeze=False)
    for axis, game in zip(axes[0], games):
        for name, label in curves[game].items():
            points = [(e.step, e.figures[name], e.intervals.get(name)) for e in evaluations if name in e.figures]
            steps = [step for step, _, _ in points]
            (line,) = axis.plot(steps, [value for _, value, _ in points], marker="o", label=label)
            bands = [(step, interval) for step, _, interval in points if interval is not None]
            if bands:
                axis.fill_between(
                    [step for step, _ in bands],
                    [lo for _, (lo, _) in bands],
                    [hi for _, (_, hi) in bands],
                    color=line.get_color(),
                    alpha=0.15,
                )
        axis.set_title(game)
        axis.set_xlabel("training step")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
