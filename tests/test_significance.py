"""The one rule for verdicts (`evaluation/significance.py`): t intervals for means, no verdict
without spread, intervals of differences (paired, and Newcombe's for two rates), exact figures by
sign, the round robin's Elo intervals, and the summary `selfplay eval` prints."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from selfplay.evaluation.game_kinds import PAYOFF, GameKind
from selfplay.evaluation.paired import difference_row, paired_comparison
from selfplay.evaluation.ratings import MIN_ELO_GAMES, elo_intervals, few_games_warning, fit_elo
from selfplay.evaluation.report import verdict_summary
from selfplay.evaluation.significance import (
    BETTER,
    FALSE_VERDICTS_NOTE,
    HIGHER,
    LOWER,
    LOWER_IS_BETTER,
    NEITHER_IS_BETTER,
    NO_SIGNIFICANT_CHANGE,
    NO_VERDICT,
    UNCHANGED,
    WORSE,
    Z_95,
    difference_interval,
    exact_verdict,
    figure_interval,
    mean_interval,
    sampled_verdict,
    wilson_interval,
)

POKER = GameKind(PAYOFF, 1.0)


def test_mean_intervals_hold_the_true_mean_95_percent_of_the_time_at_eight_games():
    """At the 8 games of a small evaluation, Student's t covers the true mean 95% of the time;
    z with the sample SD, the interval used before, covers about 0.92 of normal values."""
    samples = np.random.default_rng(0).normal(0.0, 1.0, size=(4000, 8))
    covered = [low <= 0.0 <= high for _, (low, high) in map(mean_interval, samples.tolist())]
    assert np.mean(covered) == pytest.approx(0.95, abs=0.012)
    z_covered = [abs(s.mean()) <= Z_95 * s.std(ddof=1) / math.sqrt(8) for s in samples]
    assert np.mean(z_covered) < 0.93


def test_games_that_all_agree_give_no_verdict():
    assert difference_row([1.0, 1.0], POKER)["verdict"] == NO_VERDICT  # not "better" from 2 games
    assert difference_row([1.0] * 40, POKER)["difference_ci95"] is None
    assert difference_row([-1.0], POKER)["verdict"] == NO_VERDICT
    assert difference_row([0.0, 0.0, 0.0], POKER)["verdict"] == NO_SIGNIFICANT_CHANGE  # nothing changed at all
    assert difference_row([], POKER)["verdict"] == NO_SIGNIFICANT_CHANGE


@given(st.lists(st.sampled_from([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0]), max_size=30))
def test_a_paired_difference_inside_its_interval_is_never_better_or_worse(differences):
    row = difference_row(differences, POKER)
    interval = row["difference_ci95"]
    if interval is None or interval[0] <= 0.0 <= interval[1]:
        assert row["verdict"] in (NO_SIGNIFICANT_CHANGE, NO_VERDICT)
    else:
        assert row["verdict"] == (BETTER if row["difference"] > 0 else WORSE)


def test_a_real_paired_drop_is_worse():
    # 24 games: the candidate lost 1 point more than the baseline in 18, the same in 6.
    row = difference_row([-1.0] * 18 + [0.0] * 6, POKER)
    assert row["difference"] == -0.75 and row["difference_ci95"][1] < 0 and row["verdict"] == WORSE


def test_a_figure_good_neither_high_nor_low_is_called_higher_or_lower():
    assert difference_row([1.0, 1.0, 0.5, 1.0], POKER, NEITHER_IS_BETTER)["verdict"] == HIGHER
    assert difference_row([-1.0, -1.0, -0.5, -1.0], POKER, NEITHER_IS_BETTER)["verdict"] == LOWER
    assert difference_row([1.0, -1.0, 0.5, -1.0], POKER, NEITHER_IS_BETTER)["verdict"] == NO_SIGNIFICANT_CHANGE


def test_the_interval_of_a_difference_of_two_rates_is_newcombes():
    """Newcombe (1998), table II, example (d): 56/70 against 48/80, method 10: 0.0524 to 0.3339."""
    low, high = difference_interval(48 / 80, wilson_interval(48, 80), 56 / 70, wilson_interval(56, 70))
    assert (low, high) == (pytest.approx(0.0524, abs=5e-5), pytest.approx(0.3339, abs=5e-5))
    # Two symmetric mean intervals: the difference +- sqrt(h0^2 + h1^2).
    assert difference_interval(1.0, [0.7, 1.3], 2.0, [1.6, 2.4]) == pytest.approx([0.5, 1.5])
    assert difference_interval(1.0, None, 2.0, [1.6, 2.4]) is None
    assert sampled_verdict(1.0, None) == NO_VERDICT
    assert sampled_verdict(0.5, [-0.1, 1.1]) == NO_SIGNIFICANT_CHANGE
    assert sampled_verdict(-0.5, [-0.9, -0.1], LOWER_IS_BETTER) == BETTER


def test_exact_figures_are_labelled_by_sign_in_both_directions():
    assert exact_verdict(0.006) == BETTER and exact_verdict(-0.006) == WORSE
    assert exact_verdict(-0.25, LOWER_IS_BETTER) == BETTER and exact_verdict(0.002, LOWER_IS_BETTER) == WORSE
    assert exact_verdict(3e-7) == UNCHANGED and exact_verdict(float("nan")) == NO_VERDICT


def test_elo_from_8_wins_in_10_games_is_240_with_a_binomial_interval_and_a_warning():
    wins, draws = [[0, 8], [2, 0]], [[0, 0], [0, 0]]
    ratings = fit_elo(wins, draws)
    (low, high), _ = elo_intervals(ratings, wins, draws)
    # Wilson's interval of 8/10 is 0.490-0.943; 400 log10(p / (1 - p)) of each end.
    assert (
        ratings[0] == pytest.approx(240, abs=1)
        and low == pytest.approx(-7, abs=1)
        and high == pytest.approx(488, abs=1)
    )
    warning = few_games_warning(["a", "b"], wins, draws, "--episodes")
    assert f"fewer than {MIN_ELO_GAMES} decided games" in warning and "a (10), b (10)" in warning
    assert "--episodes" in warning
    assert few_games_warning(["a", "b"], [[0, 20], [10, 0]], draws, "--episodes") is None


def test_a_perfect_score_leaves_one_end_of_its_elo_interval_open():
    wins, draws = [[0, 10, 6], [0, 0, 5], [4, 5, 0]], [[0, 0, 0], [0, 0, 0], [0, 0, 0]]
    ratings = fit_elo(wins, draws)
    intervals = elo_intervals(ratings, wins, draws)
    for rating, (low, high) in zip(ratings, intervals):
        assert low < rating < high
    undefeated = elo_intervals(*(lambda w: (fit_elo(w), w, [[0, 0], [0, 0]]))([[0, 10], [0, 0]]))
    assert undefeated[0][1] is None and undefeated[1][0] is None
    assert undefeated[0][0] == pytest.approx(400 * math.log10(0.7225 / 0.2775), abs=1)  # Wilson of 10/10


def _match(candidate: str, returns: list[float]) -> dict:
    mean, ci = mean_interval(returns)
    kind = {"name": POKER.name, "big_blind": POKER.big_blind}
    outcomes = ["wins" if r > 0 else "losses" if r < 0 else "draws" for r in returns]
    row = {"game": "kuhn_poker", "opponent": "random", "kind": kind, "returns": returns, "outcomes": outcomes}
    return {"candidate": candidate, "step": None, "mean_return": mean, "mean_return_ci95": ci} | row


def test_the_eval_summary_gives_each_figure_verdict_elo_interval_and_the_false_verdict_rate():
    matches = [_match("base", [1.0, -1.0, 2.0, -1.0] * 3), _match("new", [2.0, 1.0, 2.0, 1.0] * 3)]
    results = {
        "matches": matches,
        "comparison": paired_comparison(matches, "base"),
        "round_robin": {
            "kuhn_poker": {
                "players": ["base", "new"],
                "kind": matches[0]["kind"],
                "elo": [0.0, 240.2],
                "elo_ci95": [[-248.3, 247.0], [-6.8, 488.5]],
                "wins": [[0, 2], [8, 0]],
                "draws": [[0, 0], [0, 0]],
            }
        },
        "exploitability": [
            {"candidate": "base", "game": "kuhn_poker", "exploitability": 0.5},
            {"candidate": "new", "game": "kuhn_poker", "exploitability": 0.45},
        ],
    }
    lines = verdict_summary(results)
    assert lines[0] == "kuhn_poker vs random, mean return: base +0.250 [-0.612, +1.112], new +1.500 [+1.168, +1.832]"
    assert lines[1].startswith("new against base: significantly better on 1, worse on 0, no significant change on 0")
    assert lines[2] == "  kuhn_poker: +1.250 [+0.700, +1.800] better"
    assert lines[3] == "round robin, kuhn_poker: Elo base 0 [-248, +247], new 240 [-7, +488]"
    assert lines[4].startswith("  warning: Elo from fewer than 30 decided games")
    assert lines[5] == "exploitability (exact), kuhn_poker: base 0.5000, new 0.4500 (better than base)"
    assert lines[6] == FALSE_VERDICTS_NOTE and "1 in 20" in lines[6]


def test_a_rate_figure_gets_a_wilson_interval_inside_0_and_1_and_any_other_a_t_interval():
    mean, ci = figure_interval([1.0] + [0.0] * 15)  # 1 valid task in 16: the t interval went below 0
    assert mean == 0.0625 and ci == pytest.approx(list(wilson_interval(1, 16))) and 0.0 < ci[0]
    assert figure_interval([0.0] * 4)[1] == pytest.approx(list(wilson_interval(0, 4)))
    assert figure_interval([0.5, 0.25, 1.0]) == mean_interval([0.5, 0.25, 1.0])
