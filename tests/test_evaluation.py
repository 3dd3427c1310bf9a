"""`selfplay eval`: intervals, outcome tallies, and a tiny suite end to end, twice."""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from selfplay.cli import main
from selfplay.errors import UserError
from selfplay.evaluation.evaluate import find_candidates, load_suite, outcome_stats, plan_pairings
from selfplay.evaluation.ratings import fit_elo
from selfplay.evaluation.scoreboard import wilson_interval
from selfplay.records import MatchResult, Trajectory, Turn
from selfplay.run_dir import RunDir


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


def _trajectory(players, rewards, turns_of_policy=(), seed=0):
    result = MatchResult("kuhn_poker", seed, players, rewards, (0, 0), 2, "game_over")
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


def test_outcome_stats_count_each_seat_and_the_policys_turns():
    trajectories = [
        _trajectory(("policy", "random"), (1.0, -1.0), [(3, False), (5, True)]),
        _trajectory(("random", "policy"), (2.0, -2.0), [(4, False)]),
        _trajectory(("random", "policy"), (0.0, 0.0), [(4, False)]),
        _trajectory(("policy", "random"), (-1.0, 1.0), [(2, False)]),
    ]
    stats = outcome_stats(trajectories, "policy")
    assert (stats["games"], stats["wins"], stats["draws"], stats["losses"]) == (4, 1, 1, 2)
    assert stats["wins_rate"] == 0.25 and stats["losses_rate"] == 0.5
    assert stats["wins_ci95"] == list(wilson_interval(1, 4))
    assert stats["seats"]["0"]["wins"] == 1 and stats["seats"]["0"]["losses"] == 1
    assert stats["seats"]["1"]["draws"] == 1 and stats["seats"]["1"]["losses"] == 1
    assert stats["turns"] == 5
    assert stats["invalid_move_rate"] == pytest.approx(1 / 5)
    assert stats["mean_response_tokens"] == pytest.approx((3 + 5 + 4 + 4 + 2) / 5)


def test_elo_orders_players_by_results():
    ratings = fit_elo([[0, 9, 9], [1, 0, 6], [1, 4, 0]])
    assert ratings[0] > ratings[1] > ratings[2] == 0.0
    # 9 wins in 10 is about 382 Elo points under the logistic model.
    assert ratings[0] - ratings[1] == pytest.approx(400 * math.log10(9), rel=0.35)


def test_opponents_that_do_not_apply_to_a_game_are_left_out_with_the_reason():
    pairings, skipped = plan_pairings(["tictactoe", "kuhn_poker"], ["random", "nash"])
    assert pairings == {"tictactoe": ["random"], "kuhn_poker": ["random", "nash"]}
    assert [(s["game"], s["opponent"]) for s in skipped] == [("tictactoe", "nash")]
    assert "hidden information" in skipped[0]["reason"]
    with pytest.raises(UserError, match="unknown|Unknown"):
        plan_pairings(["tictactoe"], ["grandmaster"])


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
    printed = out.getvalue()
    return run_dir, json.loads(printed[printed.index("{\n") :])


@pytest.fixture(scope="module")
def trained_run(training):
    return training[0]


def test_training_logs_evaluations_to_tensorboard(trained_run):
    events = EventAccumulator(str(RunDir(trained_run).tensorboard))
    events.Reload()
    for tag in (
        "eval/kuhn_poker/random/wins_rate",
        "eval/kuhn_poker/nash/invalid_move_rate",
        "eval/kuhn_poker/exploitability",
    ):
        assert [e.step for e in events.Scalars(tag)] == [1, 2], tag
    assert all(0.0 <= e.value <= 1.0 for e in events.Scalars("eval/kuhn_poker/random/wins_rate"))


def test_train_command_prints_the_last_steps_evaluation(training):
    _, printed = training
    assert 0.0 <= printed["eval/kuhn_poker/random/losses_rate"] <= 1.0
    assert 0.0 <= printed["eval/kuhn_poker/exploitability"] <= 1.0
    assert "reward/mean" in printed


def test_candidates_are_the_runs_checkpoints_with_their_steps(trained_run, tmp_path):
    found = find_candidates([str(trained_run), "default"])
    assert [(c.name, c.step) for c in found] == [("run/step-000001", 1), ("run/step-000002", 2), ("default", None)]
    with pytest.raises(UserError, match="neither a run directory"):
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
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning")]
    assert warnings == [
        f"warning: left out the damaged checkpoints of '{run_dir}': step-000001 (model.safetensors is missing)"
    ]
    results = json.loads((out / "results.json").read_text())
    assert [c["name"] for c in results["candidates"]] == ["run/step-000002"]
    assert {m["candidate"] for m in results["matches"]} == {"run/step-000002"}


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
        assert row["games"] == 6 and row["wins"] + row["draws"] + row["losses"] == 6
        assert row["seats"]["0"]["games"] == row["seats"]["1"]["games"] == 3
        assert row["wins_ci95"][0] <= row["wins_rate"] <= row["wins_ci95"][1]
    table = first["round_robin"]["kuhn_poker"]
    assert table["steps"] == [1, 2] and len(table["elo"]) == 2
    assert table["wins"][0][1] + table["wins"][1][0] + table["draws"][0][1] == 6
    assert [(r["step"], r["game"]) for r in first["exploitability"]] == [(1, "kuhn_poker"), (2, "kuhn_poker")]
    assert all(0.0 <= r["exploitability"] <= 3.0 for r in first["exploitability"])

    report = (outputs[0] / "report.md").read_text()
    for plot in ("win_rate.png", "elo.png", "exploitability.png"):
        assert (outputs[0] / plot).read_bytes().startswith(b"\x89PNG")
        assert f"]({plot})" in report
    assert "Not played: tictactoe against nash" in report
    assert "run/step-000002 | 2 | kuhn_poker | nash | 6 |" in report
