"""`selfplay eval`: intervals, outcome tallies, game kinds, paired comparisons, and a tiny suite
end to end, twice."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import shutil
import warnings

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from selfplay.backends import SamplingSettings
from selfplay.cli import main
from selfplay.config import load_config
from selfplay.errors import UserError
from selfplay.evaluation import evaluate as evaluate_module
from selfplay.evaluation import report as report_module
from selfplay.evaluation.evaluate import (
    EvalSettings,
    Workload,
    evaluate,
    find_candidates,
    load_suite,
    outcome_stats,
    pairing_matches,
    plan_pairings,
    round_robin,
)
from selfplay.evaluation.game_kinds import (
    COOPERATIVE,
    GENERAL_SUM,
    PAYOFF,
    WIN_LOSS,
    GameKind,
    mbb_per_hand,
    primary_figures,
)
from selfplay.evaluation.paired import paired_comparison, summary_line
from selfplay.evaluation.ratings import fit_elo
from selfplay.evaluation.report import QUICK_EPISODES, CheckpointAxis
from selfplay.evaluation.scoreboard import seat_outcome
from selfplay.evaluation.significance import NO_VERDICT, mean_interval, wilson_interval
from selfplay.evaluation.training_curve import evaluation_table, read_evaluations
from selfplay.games import make_game
from selfplay.model_specs import ModelSpec
from selfplay.records import MatchResult, Trajectory, Turn
from selfplay.rollouts import RolloutEngine, RolloutSettings
from selfplay.run_dir import RunDir
from selfplay.train import validate


@pytest.mark.parametrize(
    "successes, trials, expected",
    [
        # By hand: centre (p + z^2/2n) / (1 + z^2/n), half-width z sqrt(p(1-p)/n + z^2/4n^2) / (1 + z^2/n).
        (5, 10, (0.2366, 0.7634)),
        (0, 10, (0.0, 0.2775)),
        (10, 10, (0.7225, 1.0)),
        (1, 4, (0.0456, 0.6994)),
        (81, 100, (0.7222, 0.8749)),
    ],
)
def test_wilson_interval_matches_hand_computed_values(successes, trials, expected):
    low, high = wilson_interval(successes, trials)
    assert low == pytest.approx(expected[0], abs=1e-4) and high == pytest.approx(expected[1], abs=1e-4)


def test_wilson_interval_without_trials_is_uninformative():
    assert wilson_interval(0, 0) == (0.0, 1.0)


def _trajectory(players, rewards, turns_of_policy=(), seed=0, end_reason="game_over"):
    result = MatchResult("kuhn_poker", seed, players, rewards, (0,) * len(players), 2, end_reason)
    turns = tuple(
        Turn(
            "kuhn_poker",
            seed,
            players.index("policy"),
            "p",
            "policy",
            0,
            (1,),
            tuple(range(n)),
            (0.0,) * n,
            "",
            "stop",
            bad,
            0.0,
        )
        for n, bad in turns_of_policy
    )
    return Trajectory(result, turns)


# Student's t quantiles of 0.975 (tables): 1, 3 and 7 degrees of freedom.
T_1, T_3, T_7 = 12.706205, 3.182446, 2.364624


def test_mean_interval_matches_hand_computed_values():
    # Mean 0.5; sample variance ((0.5^2 + 1.5^2) * 2) / 3 = 5/3; half-width t(3) * sqrt(5/3 / 4) = 2.054260.
    mean, (low, high) = mean_interval([1.0, -1.0, 2.0, 0.0])
    assert mean == 0.5 and low == pytest.approx(-1.554260, abs=1e-6) and high == pytest.approx(2.554260, abs=1e-6)
    assert T_3 * math.sqrt(5 / 12) == pytest.approx(2.054260, abs=1e-6)
    assert mean_interval([3.0, 3.0, 3.0]) == (3.0, None)  # values that all agree: no spread to measure
    assert mean_interval([0.1] * 7) == (pytest.approx(0.1), None)  # even where their mean is off by rounding
    assert mean_interval([2.0]) == (2.0, None)  # nor from one game


def test_milli_big_blinds_per_hand_follow_each_poker_games_big_blind():
    assert mbb_per_hand(0.25, 1.0) == 250.0  # Kuhn and Leduc: the ante of 1 chip is the big blind
    assert mbb_per_hand(-3.0, 100.0) == -30.0
    assert [make_game(g).big_blind for g in ("kuhn_poker", "leduc_holdem", "openspiel:leduc_poker")] == [1.0] * 3
    assert make_game("openspiel:universal_poker").big_blind == 100.0  # its blinds are "100 100"
    assert make_game("openspiel:liars_dice").big_blind is None and make_game("tictactoe").big_blind is None


@pytest.mark.parametrize(
    "spec, kind",
    [
        ("tictactoe", GameKind(WIN_LOSS)),
        ("openspiel:connect_four", GameKind(WIN_LOSS)),
        ("negotiation", GameKind(WIN_LOSS)),  # scores the larger gain +1, the smaller -1
        ("kuhn_poker", GameKind(PAYOFF, 1.0)),
        ("openspiel:liars_dice", GameKind(PAYOFF)),
        ("openspiel:pig(winscore=20)", GameKind(PAYOFF)),
        ("openspiel:first_sealed_auction", GameKind(GENERAL_SUM)),
        ("openspiel:hanabi(players=2, colors=1, ranks=2, hand_size=2)", GameKind(COOPERATIVE)),
    ],
)
def test_the_kind_of_a_game_follows_what_it_declares(spec, kind):
    assert GameKind.of(make_game(spec)) == kind


def test_the_primary_figures_follow_the_kind():
    row = {"wins_rate": 0.4, "draws_rate": 0.1, "losses_rate": 0.5, "mean_return": 0.3, "mbb_per_hand": 300.0}
    win_loss = {"wins_rate": 0.4, "draws_rate": 0.1, "losses_rate": 0.5}
    assert primary_figures({**row, "kind": {"name": WIN_LOSS, "big_blind": None}}) == win_loss
    assert primary_figures({**row, "kind": {"name": PAYOFF, "big_blind": 1.0}}) == {
        "mean_return": 0.3,
        "mbb_per_hand": 300.0,
    }
    general = {"mean_return": 4.0, "opponent_mean_return": 2.5, "kind": {"name": GENERAL_SUM, "big_blind": None}}
    assert primary_figures(general) == {"mean_return": 4.0, "opponent_mean_return": 2.5}


def test_outcome_stats_count_each_seat_and_the_policys_turns():
    trajectories = [
        _trajectory(("policy", "random"), (1.0, -1.0), [(3, False), (5, True)]),
        _trajectory(("random", "policy"), (2.0, -2.0), [(4, False)]),
        _trajectory(("random", "policy"), (0.0, 0.0), [(4, False)]),
        _trajectory(("policy", "random"), (-1.0, 1.0), [(2, False)]),
    ]
    stats = outcome_stats(trajectories, "policy", GameKind(PAYOFF, 1.0))
    assert (stats["games"], stats["wins"], stats["draws"], stats["losses"]) == (4, 1, 1, 2)
    assert stats["wins_rate"] == 0.25 and stats["losses_rate"] == 0.5
    assert stats["wins_ci95"] == list(wilson_interval(1, 4))
    assert stats["seats"]["0"]["wins"] == 1 and stats["seats"]["0"]["losses"] == 1
    assert stats["seats"]["1"]["draws"] == 1 and stats["seats"]["1"]["losses"] == 1
    assert stats["turns"] == 5
    assert stats["invalid_move_rate"] == pytest.approx(1 / 5) and stats["invalid_move_ci95"] == list(
        wilson_interval(1, 5)
    )
    assert stats["mean_response_tokens"] == pytest.approx((3 + 5 + 4 + 4 + 2) / 5)
    # Its returns 1, -2, 0, -1: mean -0.5, sample variance 5/3, half-width t(3) * sqrt(5/12) = 2.054260.
    assert stats["returns"] == [1.0, -2.0, 0.0, -1.0] and stats["outcomes"] == ["wins", "losses", "draws", "losses"]
    assert stats["mean_return"] == -0.5
    assert stats["mean_return_ci95"] == pytest.approx([-2.554260, 1.554260], abs=1e-6)
    assert stats["mbb_per_hand"] == -500.0 and stats["mbb_per_hand_ci95"] == pytest.approx([-2554.260, 1554.260])
    # Seat 0 won 1 and lost 1; seat 1 lost 2 and drew (returns -2 and 0: variance 2, half-width t(1)).
    assert stats["seats"]["0"]["mean_return"] == 0.0 and stats["seats"]["1"]["mean_return"] == -1.0
    assert stats["seats"]["1"]["mean_return_ci95"] == pytest.approx([-1 - T_1, -1 + T_1])


def test_general_sum_games_report_each_sides_return_and_no_wins():
    trajectories = [
        _trajectory(("policy", "random"), (3.0, 1.0)),
        _trajectory(("random", "policy"), (2.0, 5.0)),
    ]
    stats = outcome_stats(trajectories, "policy", GameKind(GENERAL_SUM))
    assert stats["mean_return"] == 4.0 and stats["opponent_mean_return"] == 1.5
    assert not {"wins", "wins_rate", "draws_rate", "losses_rate"} & set(stats)
    assert not {"wins", "wins_rate"} & set(stats["seats"]["0"])


def test_a_one_seat_game_is_judged_by_its_mean_return_as_a_team_of_one():
    kind = GameKind.of(make_game("arithmetic"))
    assert kind == GameKind(COOPERATIVE)
    trajectories = [_trajectory(("policy",), (1.0,)), _trajectory(("policy",), (0.0,))]
    stats = outcome_stats(trajectories, "policy", kind)
    assert stats["mean_return"] == 0.5 and stats["returns"] == [1.0, 0.0]
    assert primary_figures(stats | {"kind": {"name": kind.name}}) == {"mean_return": 0.5}


def test_truncated_games_count_in_mean_returns_and_in_no_win_draw_or_loss():
    trajectories = [
        _trajectory(("policy", "random"), (1.0, -1.0)),
        _trajectory(("random", "policy"), (0.0, 0.0), end_reason="turn_cap"),
        _trajectory(("policy", "random"), (0.5, -0.5), end_reason="turn_cap"),  # ahead when stopped: no win
        _trajectory(("random", "policy"), (0.0, 0.0)),
    ]
    stats = outcome_stats(trajectories, "policy", GameKind(WIN_LOSS))
    assert [stats[o] for o in ("wins", "draws", "losses", "truncated")] == [1, 1, 0, 2]
    assert stats["truncated_rate"] == 0.5 and stats["truncated_ci95"] == list(wilson_interval(2, 4))
    assert stats["mean_return"] == pytest.approx(1.5 / 4)  # the truncated games' returns count
    assert stats["outcomes"] == ["wins", "truncated", "truncated", "draws"]
    assert stats["seats"]["0"]["truncated"] == 1 and stats["seats"]["1"]["truncated"] == 1
    assert primary_figures(stats) == {"wins_rate": 0.25, "draws_rate": 0.25, "losses_rate": 0.0}


def test_cooperative_games_report_the_team_score_and_no_wins():
    trajectories = [
        _trajectory(("policy", "random"), (3.0, 3.0)),
        _trajectory(("random", "policy"), (1.0, 1.0), end_reason="turn_cap"),
    ]
    stats = outcome_stats(trajectories, "policy", GameKind(COOPERATIVE))
    assert stats["mean_return"] == 2.0 and stats["truncated"] == 1
    assert not {"wins", "draws_rate", "losses", "opponent_mean_return"} & set(stats)
    assert primary_figures(stats) == {"mean_return": 2.0}
    assert GameKind(COOPERATIVE).score(3.0, "draws") == 3.0 and not GameKind(COOPERATIVE).has_winners


def test_a_truncated_win_lose_game_leaves_its_pair_out_of_paired_differences():
    board = GameKind(WIN_LOSS)
    matches = [
        _row("base", "tictactoe", "random", board, [1, -1, 0, -1], [-1, 1, 0, 1], truncated={2}),
        # Win, win (truncated: no score), draw, win: the differences of games 0, 3 are 0 and 1.
        _row("new", "tictactoe", "random", board, [1, 1, 0, 1], [-1, -1, 0, -1], truncated={1}),
    ]
    row = paired_comparison(matches, "base")["differences"][0]
    assert row["games"] == 2 and row["difference"] == 0.5


def test_against_fixed_opponents_the_candidate_takes_each_of_three_seats_in_turn():
    matches = pairing_matches("openspiel:kuhn_poker(players=3)", "policy", "random", [5, 6, 7, 8], seats=3)
    assert [m.players for m in matches] == [
        ("policy", "random", "random"),
        ("random", "policy", "random"),
        ("random", "random", "policy"),
        ("policy", "random", "random"),
    ]
    assert [m.seed for m in matches] == [5, 6, 7, 8]
    # Two seats: alternating, as the round robin pairs two checkpoints.
    assert [m.players for m in pairing_matches("tictactoe", "a", "b", [1, 2])] == [("a", "b"), ("b", "a")]


def test_three_player_outcomes_are_rank_based_and_returns_are_per_seat():
    trajectories = [
        _trajectory(("policy", "random", "random"), (2.0, -1.0, -1.0)),  # highest alone: a win
        _trajectory(("random", "policy", "random"), (1.0, 1.0, -2.0)),  # tied for the highest: a draw
        _trajectory(("random", "random", "policy"), (2.0, -1.0, -1.0)),  # another seat higher: a loss
        _trajectory(("policy", "random", "random"), (-1.0, 2.0, -1.0), end_reason="turn_cap"),  # truncated
    ]
    stats = outcome_stats(trajectories, "policy", GameKind(PAYOFF, 1.0))
    assert [stats[o] for o in ("wins", "draws", "losses", "truncated")] == [1, 1, 1, 1]
    assert stats["outcomes"] == ["wins", "draws", "losses", "truncated"]
    # Returns 2, 1, -1, -1: mean 0.25, sample variance 6.75 / 3 = 2.25, half-width t(3) * 1.5 / 2 = 2.386835.
    assert stats["mean_return"] == 0.25 and stats["mbb_per_hand"] == 250.0
    assert stats["mean_return_ci95"] == pytest.approx([-2.136835, 2.636835], abs=1e-6)
    seats = stats["seats"]
    assert sorted(seats) == ["0", "1", "2"] and [seats[s]["games"] for s in "012"] == [2, 1, 1]
    assert [seats[s]["mean_return"] for s in "012"] == [0.5, 1.0, -1.0]
    assert (seats["0"]["wins"], seats["0"]["truncated"], seats["1"]["draws"], seats["2"]["losses"]) == (1, 1, 1, 1)
    # In a general-sum game, the other seats' mean return per game: -1, -0.5, 0.5, 0.5.
    assert outcome_stats(trajectories, "policy", GameKind(GENERAL_SUM))["opponent_mean_return"] == -0.125


def _row(candidate, game, opponent, kind, returns, opponent_returns, truncated=()):
    """A row of `outcome_stats` as paired comparisons read it; the games numbered in `truncated`
    were stopped by a turn cap."""
    outcomes = [seat_outcome(pair, 0) for pair in zip(returns, opponent_returns)]
    return {
        "candidate": candidate,
        "step": None,
        "game": game,
        "opponent": opponent,
        "kind": {"name": kind.name, "big_blind": kind.big_blind},
        "returns": returns,
        "outcomes": ["truncated" if i in truncated else o for i, o in enumerate(outcomes)],
    }


def test_paired_differences_on_constructed_results():
    poker, board = GameKind(PAYOFF, 1.0), GameKind(WIN_LOSS)
    matches = [
        _row("base", "kuhn_poker", "random", poker, [1, -1, 2, -2], [-1, 1, -2, 2]),
        _row("base", "kuhn_poker", "nash", poker, [-1, -1, 1, -2], [1, 1, -1, 2]),
        # Win, loss, draw, loss: scores 1, 0, 1/2, 0.
        _row("base", "tictactoe", "random", board, [1, -1, 0, -1], [-1, 1, 0, 1]),
        _row("new", "kuhn_poker", "random", poker, [2, -1, 2, -1], [-2, 1, -2, 1]),
        _row("new", "kuhn_poker", "nash", poker, [0, 0, 2, 0], [0, 0, -2, 0]),
        # Win, win, draw, forfeit (a loss): scores 1, 1, 1/2, 0.
        _row("new", "tictactoe", "random", board, [1, 1, 0, -1.5], [-1, -1, 0, 0.5]),
    ]
    comparison = paired_comparison(matches, "base")
    rows = {(r["game"], r["opponent"]): r for r in comparison["differences"] + comparison["per_game"]}
    assert len(rows) == 5 and all(r["candidate"] == "new" for r in rows.values())
    # Differences 1, 0, 0, 1: mean 0.5, variance 1/3, half-width t(3) * sqrt(1/12) = 0.918693: not significant.
    random = rows["kuhn_poker", "random"]
    assert random["difference"] == 0.5 and random["verdict"] == "no significant change"
    assert random["difference_ci95"] == pytest.approx([-0.418693, 1.418693], abs=1e-6)
    assert random["mbb_per_hand"] == 500.0 and random["mbb_per_hand_ci95"][1] == pytest.approx(1418.693, abs=1e-3)
    # Differences 1, 1, 1, 2: mean 1.25, variance 1/4, half-width t(3) / 4 = 0.795612: significantly better.
    nash = rows["kuhn_poker", "nash"]
    assert nash["difference"] == 1.25 and nash["verdict"] == "better"
    assert nash["difference_ci95"] == pytest.approx([0.454388, 2.045612], abs=1e-6)
    # Both opponents pooled: 1, 0, 0, 1, 1, 1, 1, 2: mean 0.875, variance 2.875 / 7, half-width t(7) * 0.226582.
    pooled = rows["kuhn_poker", "all"]
    assert pooled["games"] == 8 and pooled["difference"] == 0.875 and pooled["verdict"] == "better"
    assert pooled["difference_ci95"] == pytest.approx([0.339219, 1.410781], abs=1e-6)
    # Score differences 0, 1, 0, 0: mean 0.25, variance 1/4, half-width 0.795612: not significant.
    board_row = rows["tictactoe", "random"]
    assert board_row["difference"] == 0.25
    assert board_row["difference_ci95"] == pytest.approx([-0.545612, 1.045612], abs=1e-6)
    assert "mbb_per_hand" not in board_row and board_row["verdict"] == "no significant change"
    assert comparison["summary"] == {"new": {"better": 1, "worse": 0, "no significant change": 1, NO_VERDICT: 0}}
    assert summary_line("new", comparison["summary"]["new"], "base").startswith(
        "new against base: significantly better on 1, worse on 0, no significant change on 1 of 2 games"
    )


def test_a_baseline_that_is_no_candidate_is_refused_before_any_game():
    candidates = [ModelSpec("a", "model-a"), ModelSpec("b", "model-b")]
    with pytest.raises(UserError, match="--baseline 'c' is none of the candidates; give one of: a, b"):
        evaluate(candidates, EvalSettings(games=("kuhn_poker",), baseline="c"), progress=False)


def test_a_seed_deals_the_same_cards_however_the_players_play():
    """What paired comparisons rest on: Leduc Hold'em's public card, drawn after the first
    betting round, is the same for the same seed whichever moves led there."""
    boards = []
    for moves in (["check", "check"], ["raise", "call"], ["check", "raise", "call"]):
        game = make_game("leduc_holdem")
        game.reset(np.random.default_rng(11))
        for move in moves:
            game.apply(move)
        history = game.state.history()
        boards.append((history[:2], history[2 + len(moves)]))
    assert boards[0] == boards[1] == boards[2]


def test_elo_orders_players_by_results():
    ratings = fit_elo([[0, 9, 9], [1, 0, 6], [1, 4, 0]])
    assert ratings[0] > ratings[1] > ratings[2] == 0.0
    # 9 wins in 10 is about 382 Elo points under the logistic model.
    assert ratings[0] - ratings[1] == pytest.approx(400 * math.log10(9), rel=0.35)


def test_opponents_that_do_not_apply_to_a_game_are_left_out_with_the_reason():
    plan = plan_pairings(["tictactoe", "kuhn_poker"], ["random", "nash"])
    assert plan.games == {"tictactoe": ["random"], "kuhn_poker": ["random", "nash"]}
    assert [(s["game"], s["opponent"]) for s in plan.skipped] == [("tictactoe", "nash")]
    assert "hidden information" in plan.skipped[0]["reason"] and plan.models == {}
    with pytest.raises(UserError, match="unknown|Unknown"):
        plan_pairings(["tictactoe"], ["grandmaster"])


def test_a_runs_evaluation_opponent_that_cannot_play_one_of_its_games_is_refused_before_training():
    """As `selfplay eval` reports the pairing, a run refuses it: its evaluations would leave it out."""
    overrides = ["games={tictactoe: 1, kuhn_poker: 1}", "eval.every=1", "eval.opponents=[random, nash]"]
    with pytest.raises(UserError) as refused:
        validate(load_config(None, overrides))
    message = str(refused.value)
    assert message.startswith(
        "Bad value for 'eval.opponents': a run's evaluations cannot play tictactoe against nash (nash solves games "
        "with hidden information"
    )
    assert message.endswith(
        "Remove nash from eval.opponents, or give eval.games that it plays (of these games, nash: kuhn_poker)."
    )
    validate(load_config(None, [*overrides, "eval.games=[kuhn_poker]"]))


def test_an_evaluation_with_no_pairing_to_play_is_refused_before_any_model_loads():
    settings = EvalSettings(games=("tictactoe",), opponents=("nash",))
    with pytest.raises(
        UserError, match="Nothing to play: the checkpoints cannot play tictactoe against nash .* none of them"
    ):
        evaluate([ModelSpec("a", "no-such-model")], settings, progress=False)


def test_the_workload_line_counts_the_games_before_they_are_played():
    assert Workload(2, 11, 50, 250, quick=False).line() == (
        "eval: 1350 games to play: 2 checkpoints x 11 pairings x 50 games, and 250 in the round robin between "
        f"checkpoints; --quick plays {QUICK_EPISODES} games a pairing."
    )
    assert Workload(1, 1, QUICK_EPISODES, 0, quick=True).line() == (
        f"eval: {QUICK_EPISODES} games to play: 1 checkpoint x 1 pairing x {QUICK_EPISODES} games (--quick)."
    )


def test_quick_and_episodes_together_are_refused(capsys):
    argv = ["eval", "--checkpoints", "default", "--games", "kuhn_poker", "--quick", "--episodes", "5"]
    assert main(argv) == 2
    assert f"--quick plays {QUICK_EPISODES} games a pairing and --episodes 5: give one." in capsys.readouterr().err


def test_plots_name_each_checkpoint_and_join_only_one_runs_checkpoints():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    candidates = [
        {"name": "a/step-000001", "step": 1, "run": "/runs/a"},
        {"name": "a/step-000002", "step": 2, "run": "/runs/a"},
        {"name": "default", "step": None, "run": None},
        {"name": "b/step-000002", "step": 2, "run": "/runs/b"},
    ]
    names = [c["name"] for c in candidates]
    axis = CheckpointAxis.of(candidates)
    fig, ax = plt.subplots()
    axis.draw(ax, names, [0.1, 0.2, 0.3, 0.4], None, "vs random")
    axis.label_axes(ax, "kuhn_poker", "mean return")
    assert [(list(line.get_xdata()), line.get_linestyle()) for line in ax.lines] == [
        ([0, 1], "-"),  # one run's checkpoints, joined
        ([2], "None"),
        ([3], "None"),
    ]
    assert len({line.get_color() for line in ax.lines}) == 1
    assert [label.get_text() for label in ax.get_xticklabels()] == names
    assert [text.get_text() for text in ax.get_legend().get_texts()] == ["vs random"]
    plt.close(fig)
    # One run's checkpoints alone: a training curve, by step.
    curve = CheckpointAxis.of(candidates[:2])
    assert (curve.positions, curve.label, curve.names) == (
        {"a/step-000001": 1, "a/step-000002": 2},
        "step of run a",
        None,
    )


def test_the_round_robin_asks_each_checkpoint_as_its_run_did(tiny_model_dir, monkeypatch):
    styles = []

    class RecordingEngine(RolloutEngine):
        def __init__(self, players, settings, asked):
            styles.append(dict(asked))
            super().__init__(players, settings, asked)

    monkeypatch.setattr(evaluate_module, "RolloutEngine", RecordingEngine)
    candidates = [ModelSpec("a", str(tiny_model_dir)), ModelSpec("b", str(tiny_model_dir))]
    played = {"a": RolloutSettings(SamplingSettings(decoding="legal"), prompt="view"), "b": RolloutSettings()}
    settings = EvalSettings(games=("kuhn_poker",), episodes=2)
    table = round_robin(candidates, ["kuhn_poker"], settings, played, on_game=lambda *game: None)
    assert styles == [played] and table["kuhn_poker"]["games"] == [[0, 2], [2, 0]]


def test_suites_in_configs_load():
    assert "openspiel:leduc_poker" in load_suite("held_out")["games"]
    assert load_suite("train")["games"] == ["tictactoe", "kuhn_poker"]
    with pytest.raises(UserError, match="Unknown suite 'nope'.*held_out"):
        load_suite("nope")


@pytest.fixture(scope="module")
def training(tiny_model_dir, tmp_path_factory):
    """A two-step run of the tiny model through `selfplay train`, with a checkpoint per step,
    evaluated during training: its run directory and the summary the command printed."""
    run_dir = tmp_path_factory.mktemp("eval") / "run"
    overrides = [
        f"model={tiny_model_dir}",
        f"run_dir={run_dir}",
        "steps=2",
        "checkpoint_every=1",
        "keep_checkpoints=5",
        "games={kuhn_poker: 1}",
        "rollout.games_per_step=4",
        "rollout.max_new_tokens=6",
        "learner.lr=1e-2",
        "eval.every=1",
        "eval.episodes=4",
        "eval.opponents=[random, nash]",
    ]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["train", "--no-progress", *overrides]) == 0
    return run_dir, out.getvalue()


@pytest.fixture(scope="module")
def trained_run(training):
    return training[0]


@pytest.mark.slow
def test_training_logs_evaluations_to_tensorboard(trained_run):
    events = EventAccumulator(str(RunDir(trained_run).tensorboard))
    events.Reload()
    for tag in (
        "eval/kuhn_poker/random/mean_return",
        "eval/kuhn_poker/random/mbb_per_hand",
        "eval/kuhn_poker/nash/invalid_move_rate",
        "eval/kuhn_poker/exploitability",
    ):
        assert [e.step for e in events.Scalars(tag)] == [0, 1, 2], tag  # before training, then every step
    # Kuhn Poker is judged by chips: its win rates are not its primary figures.
    assert "eval/kuhn_poker/random/wins_rate" not in events.Tags()["scalars"]
    assert all(-2.0 <= e.value <= 2.0 for e in events.Scalars("eval/kuhn_poker/random/mean_return"))


def test_train_command_ends_with_the_table_of_its_first_and_last_evaluations(training):
    run_dir, printed = training
    evaluations = read_evaluations(RunDir(run_dir).eval_log)
    assert [e.step for e in evaluations] == [0, 1, 2]
    last = evaluations[-1]
    mean_return = last.figures["eval/kuhn_poker/random/mean_return"]
    assert last.figures["eval/kuhn_poker/random/mbb_per_hand"] == pytest.approx(1000 * mean_return, abs=0.1)
    # The tiny model forfeits every game (-1.5 each): a mean with no spread has no interval, a rate has one.
    assert mean_return == -1.5 and "eval/kuhn_poker/random/mean_return" not in last.intervals
    low, high = last.intervals["eval/kuhn_poker/random/truncated_rate"]
    assert low <= last.figures["eval/kuhn_poker/random/truncated_rate"] <= high
    assert "eval/kuhn_poker/exploitability" not in last.intervals  # exact: no interval
    # Every turn invalid at every evaluation: a Wilson interval over the turns, and no change.
    low, high = last.intervals["eval/kuhn_poker/random/invalid_move_rate"]
    assert low < last.figures["eval/kuhn_poker/random/invalid_move_rate"] == high == 1.0
    assert re.search(r"invalid moves vs random +1\.000 \[0\.\d\d, 1\.00\] .* no significant change", printed)
    assert 0.0 <= last.figures["eval/kuhn_poker/exploitability"] <= 1.0
    assert evaluation_table(evaluations) in printed and "step 0" in printed and "step 2" in printed
    assert "{" not in printed  # the table, not the last step's metrics
    assert RunDir(run_dir).learning_curve.read_bytes().startswith(b"\x89PNG")


def test_a_resumed_run_evaluates_the_steps_it_replays_once(trained_run, tmp_path):
    run_dir = shutil.copytree(trained_run, tmp_path / "run")
    shutil.rmtree(RunDir(run_dir).checkpoints / "step-000002")
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["train", "--no-progress", "--resume", str(run_dir)]) == 0
    evaluations = read_evaluations(RunDir(run_dir).eval_log)
    assert [e.step for e in evaluations] == [0, 1, 2]
    assert evaluations == read_evaluations(RunDir(trained_run).eval_log)  # replayed exactly


def test_candidates_are_the_runs_checkpoints_with_their_steps(trained_run, tmp_path):
    found = find_candidates([str(trained_run), "default"])
    assert [(c.name, c.step) for c in found] == [("run/step-000001", 1), ("run/step-000002", 2), ("default", None)]
    with pytest.raises(UserError, match="is a directory but not a model"):
        find_candidates([str(tmp_path)])
    corrupt = shutil.copytree(
        RunDir(trained_run).checkpoints / "step-000002", RunDir(tmp_path).checkpoints / "step-000002"
    )
    (corrupt / "trainer_state.json").write_text("{not json")
    with pytest.raises(UserError, match="step-000002' is damaged \\(trainer_state.json is unreadable"):
        find_candidates([str(corrupt)])


def test_eval_of_a_run_leaves_out_its_damaged_checkpoints_and_names_them(trained_run, tmp_path, capsys):
    """As a kill in the middle of deleting a checkpoint left it before pruning renamed first:
    its trainer state there, its weights gone. The other checkpoints are evaluated."""
    run_dir = shutil.copytree(trained_run, tmp_path / "run")
    (RunDir(run_dir).checkpoints / "step-000001" / "model.safetensors").unlink()
    out = tmp_path / "eval"
    argv = ["eval", "--checkpoints", str(run_dir), "--games", "kuhn_poker", "--episodes", "2", "--out", str(out)]
    assert main([*argv, "--no-round-robin", "--no-exploitability", "--no-progress"]) == 0
    # (The untrained model's free answers are mostly invalid, which a warning of its own says.)
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: left out")]
    assert warnings == [
        f"warning: left out the damaged checkpoints of '{run_dir}': step-000001 (model.safetensors is missing)"
    ]
    results = json.loads((out / "results.json").read_text())
    assert [c["name"] for c in results["candidates"]] == ["run/step-000002"]
    assert {m["candidate"] for m in results["matches"]} == {"run/step-000002"}


@pytest.mark.slow
def test_a_tiny_suite_evaluates_end_to_end_and_repeats_exactly(trained_run, tmp_path, capsys):
    suite = tmp_path / "tiny.yaml"
    suite.write_text("games: [kuhn_poker, tictactoe]\nopponents: [random, nash]\nepisodes: 6\n")
    outputs = []
    for name in ("first", "second"):
        out = tmp_path / name
        argv = ["eval", "--checkpoints", str(trained_run), "--suite", str(suite), "--seed", "7", "--out", str(out)]
        assert main([*argv, "--max-new-tokens", "6", "--no-progress"]) == 0
        outputs.append(out)
    first = json.loads((outputs[0] / "results.json").read_text())
    assert (outputs[0] / "results.json").read_text() == (outputs[1] / "results.json").read_text()

    pairings = [(m["candidate"], m["game"], m["opponent"]) for m in first["matches"]]
    assert pairings == [
        (f"run/step-00000{step}", game, opponent)
        for step in (1, 2)
        for game, opponent in (("kuhn_poker", "random"), ("kuhn_poker", "nash"), ("tictactoe", "random"))
    ]
    assert [(s["game"], s["opponent"]) for s in first["skipped"]] == [("tictactoe", "nash")]
    for row in first["matches"]:
        # Both games end within their own maximum length, the default turn cap: none is truncated.
        assert row["games"] == 6 and row["wins"] + row["draws"] + row["losses"] == 6 and row["truncated"] == 0
        assert row["seats"]["0"]["games"] == row["seats"]["1"]["games"] == 3
        assert row["wins_ci95"][0] <= row["wins_rate"] <= row["wins_ci95"][1]
        assert row["mean_return"] == pytest.approx(sum(row["returns"]) / 6)
        assert ("mbb_per_hand" in row) == (row["game"] == "kuhn_poker")

    # Step 2 against step 1 (the first candidate), game by game: the mean of the paired
    # differences is the difference of the means, of returns in Kuhn Poker and of scores
    # (win 1, draw 1/2) in TicTacToe.
    comparison = first["comparison"]
    assert comparison["baseline"] == "run/step-000001"
    rows = {(m["candidate"][-1], m["game"], m["opponent"]): m for m in first["matches"]}
    for diff in comparison["differences"]:
        new, base = (rows[step, diff["game"], diff["opponent"]] for step in ("2", "1"))
        if diff["game"] == "kuhn_poker":
            expected = new["mean_return"] - base["mean_return"]
        else:
            expected = new["wins_rate"] + new["draws_rate"] / 2 - base["wins_rate"] - base["draws_rate"] / 2
        assert diff["candidate"] == "run/step-000002" and diff["difference"] == pytest.approx(expected)
    assert [(r["game"], r["games"]) for r in comparison["per_game"]] == [("kuhn_poker", 12), ("tictactoe", 6)]
    assert sum(comparison["summary"]["run/step-000002"].values()) == 2

    table = first["round_robin"]["kuhn_poker"]
    assert table["steps"] == [1, 2] and len(table["elo"]) == 2
    for elo, (low, high) in zip(table["elo"], table["elo_ci95"]):
        assert (low is None or low <= elo) and (high is None or elo <= high)
    assert table["wins"][0][1] + table["wins"][1][0] + table["draws"][0][1] == 6
    assert table["mean_returns"][0][0] is None and -2.0 <= table["mean_returns"][0][1] <= 2.0
    assert [(r["step"], r["game"]) for r in first["exploitability"]] == [(1, "kuhn_poker"), (2, "kuhn_poker")]
    assert all(0.0 <= r["exploitability"] <= 3.0 for r in first["exploitability"])

    report = (outputs[0] / "report.md").read_text()
    for plot in ("primary.png", "elo.png", "exploitability.png"):
        assert (outputs[0] / plot).read_bytes().startswith(b"\x89PNG")
        assert f"]({plot})" in report
    assert "Not played: tictactoe against nash" in report
    assert "### kuhn_poker: judged by mean return per game" in report
    assert "| games | mean return | seat 0 | seat 1 | mbb/hand | win | draw | loss | truncated |" in report
    assert "| checkpoint | step | opponent | games | win | draw | loss | truncated | mean return |" in report
    assert "run/step-000002 | 2 | nash | 6 |" in report
    assert "## Compared with run/step-000001" in report
    # Kuhn Poker's two opponents pooled in a row of their own; TicTacToe's one opponent's row says it all.
    pooled = report.index("| run/step-000002 | kuhn_poker | all | 12 |")
    assert report.index("| run/step-000002 | kuhn_poker | nash |") < pooled < report.index("| tictactoe | random |")
    assert "| tictactoe | all |" not in report
    assert [c["run"] for c in first["candidates"]] == [str(trained_run)] * 2
    assert "run/step-000002 against run/step-000001: significantly better on" in report
    assert "**Warning:** Elo from fewer than 30 decided games" in report  # 6 games a pairing
    printed = capsys.readouterr().out
    assert "run/step-000002 against run/step-000001: significantly better on" in printed
    assert "round robin, kuhn_poker: Elo run/step-000001 " in printed and "1 in 20" in printed


def test_eval_and_play_print_no_transformers_bars_or_warnings(tiny_model_dir, tmp_path, capsys):
    from transformers.utils import logging as transformers_logging

    transformers_logging.enable_progress_bar()  # as in a fresh process; a training run here turned it off
    argv = ["eval", "--checkpoints", str(tiny_model_dir), "--games", "kuhn_poker", "--quick", "--out", str(tmp_path)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main([*argv, "--no-exploitability", "--no-progress"]) == 0
        assert (
            main(
                ["play", "kuhn_poker", "--agents", f"model:{tiny_model_dir},random", "--episodes", "2", "--no-progress"]
            )
            == 0
        )
    err = capsys.readouterr().err
    assert "Loading weights" not in err and "it/s" not in err
    assert f"eval: {QUICK_EPISODES} games to play: 1 checkpoint x 1 pairing x {QUICK_EPISODES} games (--quick)." in err
    assert "**A quick evaluation** (`--quick`" in (tmp_path / "report.md").read_text()
    assert [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))] == []


def test_a_three_player_game_evaluates_end_to_end_with_paired_comparison(tiny_model_dir, tmp_path, capsys):
    """Two copies of the tiny model meet the same deals in the same seats, so every paired
    difference is 0; the round robin, which pairs two checkpoints, is left out with its reason.
    The terminal shows the summary that opens the report."""
    copy = shutil.copytree(tiny_model_dir, tmp_path / "copy")
    game, out = "openspiel:kuhn_poker(players=3)", tmp_path / "eval"
    argv = ["eval", "--checkpoints", str(tiny_model_dir), str(copy), "--games", game, "--episodes", "3"]
    argv += ["--opponents", "random,nash", "--decoding", "legal", "--max-new-tokens", "4", "--seed", "3"]
    assert main([*argv, "--no-exploitability", "--no-progress", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert [(s["game"], s["opponent"]) for s in results["skipped"]] == [(game, "nash")]  # two-player only
    first, second = results["matches"]
    assert first["opponent"] == second["opponent"] == "random"
    for row in (first, second):
        assert row["games"] == 3 and row["wins"] + row["draws"] + row["losses"] + row["truncated"] == 3
        assert {seat: figures["games"] for seat, figures in row["seats"].items()} == {"0": 1, "1": 1, "2": 1}
    assert first["returns"] == second["returns"] and first["outcomes"] == second["outcomes"]
    (difference,) = results["comparison"]["differences"]
    assert difference["difference"] == 0.0 and difference["verdict"] == "no significant change"
    assert results["round_robin"] == {}
    assert results["round_robin_skipped"] == [
        {"game": game, "reason": "3 players: the round robin pairs two checkpoints in a two-player game"}
    ]
    report = (out / "report.md").read_text()
    assert "| mean return | seat 0 | seat 1 | seat 2 | mbb/hand | win | draw | loss | truncated |" in report
    assert f"No round robin: {game} (3 players" in report
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith(f"{game} vs random, mean return: ")
    assert printed[1].startswith(f"{copy} against ") and "no significant change on 1 of 1 games" in printed[1]
    assert printed[2] == f"  {game}: +0.000 no significant change"
    assert printed[3].startswith("Each verdict is a test at the 5% level")
    assert printed[-1] == f"Wrote {out / 'report.md'} and {out / 'results.json'}."
    assert "## Summary\n\n- " + printed[0] in report


def test_role_figures_are_averaged_over_the_games_that_have_them_and_compared_game_by_game():
    def played(candidate, figures):
        trajectories = []
        for seed, (seat, mine) in enumerate(figures):
            players = ("policy", "base") if seat == 0 else ("base", "policy")
            per_seat = [(), ()]
            per_seat[seat] = tuple(sorted(mine.items()))
            result = MatchResult(
                "secret_keeping", seed, players, (0.0, 0.0), (0, 0), 2, "game_over", None, tuple(per_seat)
            )
            trajectories.append(Trajectory(result, ()))
        stats = outcome_stats(trajectories, "policy", GameKind(WIN_LOSS))
        return {"candidate": candidate, "step": None, "game": "secret_keeping", "opponent": "base", **stats}

    # As attacker in games 0-1 (success), as defender in games 2-3 (leaks, and over-refusal where asked).
    base = played("base", [(0, {"attack_success": 0.0}), (0, {"attack_success": 0.0}),
                           (1, {"leaked": 1.0}), (1, {"leaked": 1.0, "over_refusal": 0.0})])  # fmt: skip
    new = played("new", [(0, {"attack_success": 1.0}), (0, {"attack_success": 1.0}),
                         (1, {"leaked": 0.0}), (1, {"leaked": 0.0, "over_refusal": 1.0})])  # fmt: skip
    # A rate's interval is Wilson's, which a rate of 2 in 2 has too.
    assert new["role_figures"]["attack_success"] == {"mean": 1.0, "ci95": list(wilson_interval(2, 2)), "games": 2}
    assert new["role_figures"]["over_refusal"] == {"mean": 1.0, "ci95": list(wilson_interval(1, 1)), "games": 1}
    assert new["role_figure_values"]["leaked"] == [None, None, 0.0, 0.0]
    rows = {r["figure"]: r for r in paired_comparison([base, new], "base")["role_figures"]}
    # Two games that moved alike say nothing of the spread: no verdict, however large the change.
    assert rows["attack_success"]["difference"] == 1.0 and rows["attack_success"]["verdict"] == NO_VERDICT
    assert rows["leaked"]["difference"] == -1.0 and rows["leaked"]["verdict"] == NO_VERDICT
    assert (rows["leaked"]["mean"], rows["leaked"]["baseline_mean"]) == (0.0, 1.0)
    assert rows["over_refusal"]["games"] == 1 and rows["over_refusal"]["verdict"] == NO_VERDICT


def test_a_role_games_table_heads_each_seats_return_by_its_role():
    trajectories = [
        _trajectory(("policy", "random"), (1.0, -1.0)),
        _trajectory(("random", "policy"), (1.0, -1.0)),
    ]
    stats = outcome_stats(trajectories, "policy", GameKind(WIN_LOSS))
    row = {"candidate": "c", "step": 1, "opponent": "random"} | stats
    header = report_module._match_table([row], GameKind(WIN_LOSS), make_game("secret_keeping").roles)[0]
    assert "| as attacker | as defender |" in header and "seat 0" not in header
