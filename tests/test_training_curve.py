"""The evaluations a run logs as it trains: the log survives a kill, a resumed run forgets what
it replays, and the before/after table and the learning curve show what training changed."""

from __future__ import annotations

from selfplay.evaluation.significance import wilson_interval
from selfplay.evaluation.training_curve import (
    Evaluation,
    append_evaluation,
    change,
    evaluation_table,
    keep_evaluations_up_to,
    plot_learning_curve,
    read_evaluations,
)

BEFORE = Evaluation(
    0,
    {
        "eval/kuhn_poker/exploitability": 0.586,
        "eval/kuhn_poker/random/mean_return": -0.25,
        "eval/tictactoe/exact_non_loss": 0.566,
        "eval/tictactoe/exact_non_loss_seat_0": 0.706,
        "eval/tictactoe/random/wins_rate": 0.125,
        "eval/tictactoe/random/draws_rate": 0.25,
        "time/eval_s": 70.0,
    },
    {
        "eval/kuhn_poker/random/mean_return": (-0.5, 0.0),
        "eval/tictactoe/random/wins_rate": (0.05, 0.29),
        "eval/tictactoe/random/draws_rate": (0.10, 0.47),
    },
)
AFTER = Evaluation(
    40,
    {
        "eval/kuhn_poker/exploitability": 0.333,
        "eval/kuhn_poker/random/mean_return": 0.5,
        "eval/tictactoe/exact_non_loss": 0.564,
        "eval/tictactoe/exact_non_loss_seat_0": 0.75,
        "eval/tictactoe/random/wins_rate": 0.125,
        "eval/tictactoe/random/draws_rate": 0.5,
        "time/eval_s": 65.0,
    },
    {
        "eval/kuhn_poker/random/mean_return": (0.25, 0.75),
        "eval/tictactoe/random/wins_rate": (0.05, 0.29),
        "eval/tictactoe/random/draws_rate": (0.32, 0.68),
    },
)


def test_the_log_reads_back_what_was_appended_and_passes_over_a_torn_line(tmp_path):
    log = tmp_path / "eval.jsonl"
    assert read_evaluations(log) == []
    append_evaluation(log, BEFORE)
    append_evaluation(log, AFTER)
    with log.open("a") as file:
        file.write('{"step": 41, "figures": {"eval/kuhn')  # killed while writing
    assert read_evaluations(log) == [BEFORE, AFTER]


def test_a_resumed_run_forgets_the_evaluations_after_its_checkpoint(tmp_path):
    log = tmp_path / "eval.jsonl"
    keep_evaluations_up_to(log, 10)  # no log yet: nothing to do
    assert not log.exists()
    for evaluation in (BEFORE, AFTER):
        append_evaluation(log, evaluation)
    keep_evaluations_up_to(log, 39)
    assert read_evaluations(log) == [BEFORE]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.jsonl"]


def _row(lines: list[str], label: str) -> str:
    return next(line for line in lines if label in line)


def test_the_table_puts_each_figure_before_and_after_with_its_change_interval_and_verdict():
    lines = evaluation_table([BEFORE, AFTER]).splitlines()
    assert lines[0].split() == ["game", "figure", "step", "0", "step", "40", "change", "verdict"]
    assert lines[2 + 6] == ""  # times are left out; the note on verdicts follows
    assert "leaves out 0" in " ".join(lines[9:]) and "1 in 20" in " ".join(lines[9:])
    exploitability = _row(lines, "exploitability")
    assert exploitability.startswith("kuhn_poker") and exploitability.split()[-2:] == ["-0.253", "better"]
    mean_return = _row(lines, "mean return vs random")
    assert "-0.250 [-0.50, 0.00]" in mean_return and "0.500 [0.25, 0.75]" in mean_return
    # MOVER: 0.75 - hypot(0.25, 0.25) = 0.396, 0.75 + hypot(0.25, 0.25) = 1.104.
    assert mean_return.endswith("+0.750 [+0.40, +1.10]  better")
    assert mean_return.startswith(" ")  # the game is named once, on its first row
    non_loss = _row(lines, "non-loss vs random, exact (both seats)")
    assert non_loss.startswith("tictactoe") and non_loss.split()[-2:] == ["-0.002", "worse"]  # exact: by sign
    assert _row(lines, "first player").split()[-2:] == ["+0.044", "better"]
    assert _row(lines, "win rate").endswith("+0.000 [-0.18, +0.18]  no significant change")
    # Neither better nor worse, and +0.25 is inside the interval of the change.
    assert _row(lines, "draw rate").endswith("+0.250 [-0.03, +0.48]  no significant change")


def _rates(step: int, figures: dict[str, tuple[int, int]], exact: dict[str, float] = {}) -> Evaluation:  # noqa: B006
    """An evaluation of `figures` counted as (successes, games), with their Wilson intervals."""
    names = {f"eval/tictactoe/random/{name}": counts for name, counts in figures.items()}
    return Evaluation(
        step,
        {name: won / games for name, (won, games) in names.items()} | exact,
        {name: wilson_interval(won, games) for name, (won, games) in names.items()},
    )


def test_a_change_inside_its_interval_is_never_better():
    """The issue's case: +0.031 win rate with almost identical intervals was "(better)"."""
    lines = evaluation_table([_rates(0, {"wins_rate": (15, 32)}), _rates(2, {"wins_rate": (16, 32)})]).splitlines()
    assert _row(lines, "win rate").endswith("no significant change")
    for won in range(33):
        before, after = _rates(0, {"wins_rate": (15, 32)}), _rates(2, {"wins_rate": (won, 32)})
        difference, interval, verdict = change(before, after, "eval/tictactoe/random/wins_rate")
        if interval[0] <= 0 <= interval[1]:
            assert verdict == "no significant change"
        else:
            assert verdict == ("better" if difference > 0 else "worse")


def test_a_real_drop_is_worse_and_an_exact_change_is_labelled_by_sign():
    before = _rates(0, {"wins_rate": (16, 32), "losses_rate": (12, 32)}, {"eval/tictactoe/exact_non_loss": 0.560})
    after = _rates(2, {"wins_rate": (2, 32), "losses_rate": (28, 32)}, {"eval/tictactoe/exact_non_loss": 0.566})
    lines = evaluation_table([before, after]).splitlines()
    assert _row(lines, "win rate").endswith("worse") and _row(lines, "loss rate").endswith("worse")
    assert _row(lines, "non-loss").split()[-2:] == ["+0.006", "better"]  # exact: no sampling to test
    back = Evaluation(3, {"eval/tictactoe/exact_non_loss": 0.566 + 2e-7}, {})
    assert change(after, back, "eval/tictactoe/exact_non_loss")[2] == "unchanged"  # within rounding


def test_a_figure_without_an_interval_gets_no_verdict():
    """Two evaluations whose games all returned alike have no spread to judge a change by."""
    name = "eval/kuhn_poker/random/mean_return"
    before, after = Evaluation(0, {name: 1.0}, {}), Evaluation(2, {name: -1.0}, {})
    assert change(before, after, name) == (-2.0, None, "no verdict")
    assert _row(evaluation_table([before, after]).splitlines(), "mean return").endswith("-2.000  no verdict")


def test_one_evaluation_is_shown_alone():
    lines = evaluation_table([AFTER]).splitlines()
    assert lines[0].split() == ["game", "figure", "step", "40"]
    assert "0.333" in next(line for line in lines if "exploitability" in line)


def test_the_learning_curve_is_a_png(tmp_path):
    path = plot_learning_curve([BEFORE, AFTER], tmp_path / "curve.png")
    assert path.read_bytes().startswith(b"\x89PNG")


def test_a_role_games_figures_are_listed_after_its_own_and_called_higher_or_lower():
    game = "secret_keeping"
    before = Evaluation(
        0,
        {f"eval/{game}/random/mean_return": 0.0, f"eval/{game}/random/role/attack_success": 0.1},
        {f"eval/{game}/random/mean_return": (-0.2, 0.2), f"eval/{game}/random/role/attack_success": (0.05, 0.15)},
    )
    after = Evaluation(
        5,
        {f"eval/{game}/random/mean_return": 0.1, f"eval/{game}/random/role/attack_success": 0.6},
        {f"eval/{game}/random/mean_return": (-0.1, 0.3), f"eval/{game}/random/role/attack_success": (0.5, 0.7)},
    )
    lines = evaluation_table([before, after]).splitlines()
    mean_return = next(i for i, line in enumerate(lines) if "mean return vs random" in line)
    role = next(i for i, line in enumerate(lines) if "attack success vs random (role figure)" in line)
    assert role > mean_return
    assert lines[role].rstrip().endswith("higher")  # one role's gain is the other's loss: no "better"
    assert change(before, after, f"eval/{game}/random/role/attack_success")[2] == "higher"
