"""The evaluations a run logs as it trains: the log survives a kill, a resumed run forgets what
it replays, and the before/after table and the learning curve show what training changed."""

from __future__ import annotations

from selfplay.evaluation.training_curve import (
    Evaluation,
    append_evaluation,
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
    {"eval/kuhn_poker/random/mean_return": (-0.5, 0.0), "eval/tictactoe/random/wins_rate": (0.05, 0.29)},
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
    {"eval/kuhn_poker/random/mean_return": (0.25, 0.75), "eval/tictactoe/random/wins_rate": (0.05, 0.29)},
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


def test_the_table_puts_each_figure_before_and_after_with_its_change_and_interval():
    lines = evaluation_table([BEFORE, AFTER]).splitlines()
    assert lines[0].split() == ["game", "figure", "step", "0", "step", "40", "change"]
    assert len(lines) == 2 + 6  # times are left out
    exploitability = next(line for line in lines if "exploitability" in line)
    assert exploitability.startswith("kuhn_poker") and exploitability.split()[-2:] == ["-0.253", "(better)"]
    mean_return = next(line for line in lines if "mean return vs random" in line)
    assert "-0.250 [-0.50, 0.00]" in mean_return and "0.500 [0.25, 0.75]" in mean_return
    assert mean_return.split()[-2:] == ["+0.750", "(better)"]
    assert mean_return.startswith(" ")  # the game is named once, on its first row
    non_loss = next(line for line in lines if "non-loss vs random, exact (both seats)" in line)
    assert non_loss.startswith("tictactoe") and non_loss.split()[-1] == "-0.002"  # worse, and unmarked
    assert next(line for line in lines if "first player" in line).split()[-2:] == ["+0.044", "(better)"]
    assert next(line for line in lines if "win rate" in line).split()[-1] == "+0.000"
    assert next(line for line in lines if "draw rate" in line).split()[-1] == "+0.250"  # neither better nor worse


def test_one_evaluation_is_shown_alone():
    lines = evaluation_table([AFTER]).splitlines()
    assert lines[0].split() == ["game", "figure", "step", "40"]
    assert "0.333" in next(line for line in lines if "exploitability" in line)


def test_the_learning_curve_is_a_png(tmp_path):
    path = plot_learning_curve([BEFORE, AFTER], tmp_path / "curve.png")
    assert path.read_bytes().startswith(b"\x89PNG")
