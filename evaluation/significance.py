"""Intervals and verdicts: the one rule by which the training table, the eval report and the
plots call a figure better or worse.

Intervals are 95%:

- a rate: Wilson's score interval, which stays inside [0, 1] and is not empty at 0 or at every
  trial a success;
- a mean: mean +- t * s / sqrt(n), with the sample standard deviation s and Student's t
  quantile on n - 1 degrees of freedom (the normal quantile is too narrow at the 8-32 games of an
  evaluation: at n = 8 its "95%" interval holds the true mean of normal values 92% of the time,
  and less for skewed scores). None from fewer than two values, or from values that all agree:
  an interval of no width would claim a certainty that a handful of alike games cannot give.

A sampled figure (from games played) is called better or worse only when the 95% interval of
its *difference* leaves out 0, "no significant change" otherwise, and "no verdict" when that
interval cannot be formed (too few games, or no spread), unless the difference is exactly 0:

- where the records pair games (the eval report: every candidate meets the same deals, seats
  and opponent seeds), the interval of the mean paired difference (`mean_interval` of the
  per-game differences);
- where they do not (the training table and its plot: the evaluation log keeps each
  evaluation's figures and intervals, not its games), `difference_interval`: the MOVER interval
  (Zou and Donner, 2008) built from the two intervals, which for two Wilson intervals is
  Newcombe's hybrid score interval for a difference of rates (his method 10) and for two
  symmetric mean intervals is the difference +- sqrt(h0^2 + h1^2). It treats the two evaluations
  as independent; they replay the same deals, so their figures are if anything positively
  correlated, which makes this interval wider than a paired one would be: conservative.

An exact figure (computed from the probability of every move, no sampling: exploitability, the
exact non-loss rate) is better or worse by its sign alone, in either direction, once the change
exceeds `NUMERICAL_TOLERANCE`, "unchanged" otherwise. Nothing larger is cut off: a threshold on
the size of an exact change would be a judgement of practical size, not of significance.

A figure that is good neither high nor low (the draw rate: more draws may mean fewer wins) is
called "higher" or "lower" by the same rules.

No correction is made for the number of verdicts: each is a test at the 5% level, so among
many games, opponents and figures about 1 in 20 of those that did not change is still called
better or worse (`FALSE_VERDICTS_NOTE`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scipy import stats

CONFIDENCE = 0.95
Z_95 = float(stats.norm.ppf(0.5 + CONFIDENCE / 2))  # 1.959963984540054
# Below this an exact change is rounding: exact figures sum float32 probabilities over a game tree.
NUMERICAL_TOLERANCE = 1e-6

BETTER, WORSE = "better", "worse"
HIGHER, LOWER = "higher", "lower"  # the verdicts on a figure that is good neither high nor low
NO_SIGNIFICANT_CHANGE = "no significant change"
NO_VERDICT = "no verdict"
UNCHANGED = "unchanged"  # an exact figure within NUMERICAL_TOLERANCE of its value before

# Which way a figure is good.
HIGHER_IS_BETTER, LOWER_IS_BETTER, NEITHER_IS_BETTER = "higher is better", "lower is better", "neither"

FALSE_VERDICTS_NOTE = (
    "Each verdict is a test at the 5% level with no correction for how many are made: among many games, "
    "opponents and figures, about 1 in 20 of those that did not change is still called better or worse."
)


def wilson_interval(successes: float, trials: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval for a binomial rate (95% by default); draws may count as half a
    success. Unlike the normal approximation it stays inside [0, 1] and is not empty at 0 or
    `trials` successes."""
    if trials <= 0:
        return (0.0, 1.0)
    rate = successes / trials
    spread = z * z / trials
    centre = (rate + spread / 2) / (1 + spread)
    half = z * math.sqrt(rate * (1 - rate) / trials + spread / (4 * trials)) / (1 + spread)
    # Rounding can put a bound a hair past the rate at 0 or `trials` successes.
    return (max(0.0, min(rate, centre - half)), min(1.0, max(rate, centre + half)))


def interval_of_mean(games: int, mean: float, variance: float) -> list[float] | None:
    """The 95% interval of a mean of `games` values with sample variance `variance`, by Student's
    t; None from fewer than two values or with no spread (a standard deviation within rounding
    of 0, relative to the mean)."""
    if games < 2 or math.sqrt(max(variance, 0.0)) <= NUMERICAL_TOLERANCE * max(1.0, abs(mean)):
        return None
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, games - 1)) * math.sqrt(variance / games)
    return [mean - half, mean + half]


def mean_interval(values: Sequence[float]) -> tuple[float, list[float] | None]:
    """The mean of `values` and its 95% interval (`interval_of_mean`)."""
    n = len(values)
    mean = math.fsum(values) / n if n else 0.0
    if n < 2 or min(values) == max(values):
        return mean, None
    return mean, interval_of_mean(n, mean, math.fsum((v - mean) ** 2 for v in values) / (n - 1))


def figure_interval(values: Sequence[float]) -> tuple[float, list[float] | None]:
    """The mean of a per-game figure and its 95% interval: Wilson's when every value is 0 or 1 (a
    rate, such as leaks or valid tasks, whose interval must stay inside [0, 1]), else Student's t
    (`mean_interval`)."""
    if values and all(v in (0, 1) for v in values):
        successes = math.fsum(values)
        return successes / len(values), list(wilson_interval(successes, len(values)))
    return mean_interval(values)


def difference_interval(
    before: float, before_ci: Sequence[float] | None, after: float, after_ci: Sequence[float] | None
) -> list[float] | None:
    """The 95% interval of `after - before` from two independent estimates and their 95%
    intervals (MOVER; see the module): None when either has no interval."""
    if before_ci is None or after_ci is None:
        return None
    difference = after - before
    below = math.hypot(after - after_ci[0], before_ci[1] - before)
    above = math.hypot(after_ci[1] - after, before - before_ci[0])
    return [difference - below, difference + above]


def _by_sign(change: float, direction: str) -> str:
    if direction == NEITHER_IS_BETTER:
        return HIGHER if change > 0 else LOWER
    return BETTER if (change > 0) == (direction == HIGHER_IS_BETTER) else WORSE


def sampled_verdict(difference: float, interval: Sequence[float] | None, direction: str = HIGHER_IS_BETTER) -> str:
    """The verdict on a sampled figure that changed by `difference`, whose 95% interval is
    `interval` (see the module)."""
    if difference == 0.0:
        return NO_SIGNIFICANT_CHANGE
    if interval is None or not math.isfinite(difference):
        return NO_VERDICT
    if interval[0] <= 0.0 <= interval[1]:
        return NO_SIGNIFICANT_CHANGE
    return _by_sign(difference, direction)


def exact_verdict(change: float, direction: str = HIGHER_IS_BETTER) -> str:
    """The verdict on an exact figure that changed by `change`: by its sign beyond rounding."""
    if not math.isfinite(change):
        return NO_VERDICT
    if abs(change) <= NUMERICAL_TOLERANCE:
        return UNCHANGED
    return _by_sign(change, direction)
