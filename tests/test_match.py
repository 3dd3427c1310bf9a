import json

import pytest

from selfplay import cli
from selfplay.cli import main
from selfplay.config import RolloutConfig
from selfplay.evaluation.scoreboard import format_table, tally
from selfplay.match import agent_labels, play_series
from selfplay.records import MatchResult
from selfplay.rollouts import RolloutSettings


def test_same_seed_same_results_and_seats_alternate():
    first = play_series("kuhn_poker", ["random", "random"], 40, seed=3, progress=False)
    again = play_series("kuhn_poker", ["random", "random"], 40, seed=3, progress=False)
    other = play_series("kuhn_poker", ["random", "random"], 40, seed=4, progress=False)
    assert first == again
    assert first != other
    assert [r.players for r in first[:3]] == [
        ("random#1", "random#2"),
        ("random#2", "random#1"),
        ("random#1", "random#2"),
    ]
    assert len({r.seed for r in first}) == 40  # every game gets its own deal


def test_agent_labels_only_number_repeats():
    assert agent_labels(["nash", "random"]) == ["nash", "random"]
    assert agent_labels(["random", "mcts", "random"]) == ["random#1", "mcts", "random#2"]


def test_tally_against_hand_counts():
    results = [
        MatchResult("g", 0, ("a", "b"), (1.0, -1.0), (0, 0), 5, "game_over"),
        MatchResult("g", 1, ("b", "a"), (0.5, -1.5), (0, 1), 2, "invalid_move"),
        MatchResult("g", 2, ("a", "b"), (0.0, 0.0), (0, 0), 50, "turn_cap"),
    ]
    a, b = tally(results)
    # The game stopped by the turn cap is truncated, neither a draw nor anything else.
    assert (a.agent, a.games, a.wins, a.draws, a.losses, a.truncated, a.invalid_moves) == ("a", 3, 1, 0, 1, 1, 1)
    assert a.mean_reward == pytest.approx((1.0 - 1.5 + 0.0) / 3)
    assert (b.wins, b.draws, b.losses, b.truncated, b.invalid_moves, b.total_reward) == (1, 0, 1, 1, 0, -0.5)
    table = format_table([a, b]).splitlines()
    assert table[0].split() == ["agent", "games", "wins", "draws", "losses", "truncated", "invalid", "mean", "reward"]
    assert table[2].split() == ["a", "3", "1", "0", "1", "1", "1", "-0.167"]


def run_cli(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_play_json_is_reproducible(capsys):
    args = (
        "play",
        "tictactoe",
        "--agents",
        "random,random",
        "--episodes",
        "30",
        "--seed",
        "7",
        "--json",
        "--no-progress",
    )
    code, out, _ = run_cli(capsys, *args)
    assert code == 0
    summary = json.loads(out)
    assert summary["episodes"] == 30 and [a["agent"] for a in summary["agents"]] == ["random#1", "random#2"]
    for agent in summary["agents"]:
        assert agent["wins"] + agent["draws"] + agent["losses"] == 30
    assert run_cli(capsys, *args)[1] == out


def test_play_reports_games_stopped_by_a_turn_cap_as_truncated_and_warns_once(capsys):
    args = ("play", "openspiel:othello", "--agents", "random,random", "--episodes", "4", "--json", "--no-progress")
    code, out, err = run_cli(capsys, *args, "--max-turns", "10")
    summary = json.loads(out)
    assert code == 0 and summary["truncated"] == 4 and summary["mean_turns"] == 10
    assert all(agent["truncated"] == 4 and agent["draws"] == 0 for agent in summary["agents"])
    assert err.count("warning:") == 1 and "4 of 4 games were stopped by a turn cap" in err
    # By default Othello is played to its end (OpenSpiel's max_game_length() is its cap).
    code, out, err = run_cli(capsys, *args)
    assert json.loads(out)["truncated"] == 0 and json.loads(out)["mean_turns"] > 50 and "warning" not in err


def test_play_table(capsys):
    code, out, _ = run_cli(
        capsys, "play", "kuhn_poker", "--agents", "random,random", "--episodes", "5", "--no-progress"
    )
    assert code == 0 and "mean reward" in out and "random#2" in out


def test_play_reads_its_options_as_a_configs_rollout_section(capsys, monkeypatch):
    asked = []

    def play_and_record(*args, rollout, **kwargs):
        asked.append(rollout)
        return play_series(*args, rollout=rollout, **kwargs)

    monkeypatch.setattr(cli, "play_series", play_and_record)
    options = ["--retries", "2", "--max-turns", "7", "--temperature", "0.5", "--decoding", "legal", "--prompt", "view"]
    options += ["--max-new-tokens", "5", "--observation-mode", "multi_turn"]
    assert run_cli(capsys, "play", "kuhn_poker", "--agents", "random,random", "--episodes", "2", *options)[0] == 0
    expected = RolloutConfig(
        retries=2,
        max_turns=7,
        temperature=0.5,
        decoding="legal",
        prompt="view",
        max_new_tokens=5,
        observation_mode="multi_turn",
    )
    assert asked == [RolloutSettings.from_config(expected)]


@pytest.mark.parametrize(
    "args, message",
    [
        (("play", "chess_960", "--agents", "random,random"), "Unknown game 'chess_960'. Games: tictactoe"),
        (("play", "tictactoe", "--agents", "random,alphago"), "Unknown agent 'alphago'. Agents: random"),
        (("play", "tictactoe", "--agents", "random"), "'tictactoe' has 2 seats but 1 agents were given"),
        (("play", "tictactoe", "--agents", "random:3,random"), "Agent 'random' takes no argument"),
    ],
)
def test_user_errors_exit_2_with_one_message(capsys, args, message):
    code, out, err = run_cli(capsys, *args, "--no-progress")
    assert code == 2 and out == ""
    assert err.startswith("selfplay: error: ") and message in err
    assert "Traceback" not in err


def test_games_list_shows_natives_and_adapters(capsys):
    code, out, _ = run_cli(capsys, "games", "list")
    assert code == 0
    for name in (
        "tictactoe",
        "kuhn_poker",
        "leduc_holdem",
        "negotiation",
        "openspiel:NAME",
        "pettingzoo:MODULE",
        "selfplay.games",
    ):
        assert name in out


@pytest.mark.parametrize("command", [(), ("play",), ("games",), ("games", "list")])
def test_every_command_has_help(capsys, command):
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: selfplay" in capsys.readouterr().out


def test_play_with_a_model_agent_is_reproducible(capsys, tiny_model_dir):
    args = ("play", "kuhn_poker", "--agents", f"model:{tiny_model_dir},random", "--episodes", "6", "--json")
    code, out, _ = run_cli(capsys, *args, "--retries", "2", "--max-new-tokens", "8", "--no-progress")
    assert code == 0
    model, scripted = json.loads(out)["agents"]
    assert model["agent"] == f"model:{tiny_model_dir}" and model["games"] == 6
    # An untrained model writes no legal move: every game ends on its third invalid answer.
    assert model["losses"] == 6 and model["invalid_moves"] == 18
    assert run_cli(capsys, *args, "--retries", "2", "--max-new-tokens", "8", "--no-progress")[1] == out


def test_unknown_model_path_is_a_user_error(capsys, tmp_path):
    code, _, err = run_cli(capsys, "play", "tictactoe", "--agents", f"model:{tmp_path}/missing,random", "--no-progress")
    assert code == 2 and "missing" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("verb", "option", "value", "message"),
    [
        ("play", "--seed", "-1", "argument --seed: expected a whole number from 0 to 4294967295, got '-1'"),
        ("eval", "--seed", "-1", "argument --seed: expected a whole number from 0 to 4294967295, got '-1'"),
        ("play", "--episodes", str(2**64), "argument --episodes: expected a whole number from 1 to 1000000"),
        ("eval", "--episodes", str(2**64), "argument --episodes: expected a whole number from 1 to 1000000"),
        ("play", "--temperature", "nan", "argument --temperature: expected a number at least 0, got 'nan'"),
        ("play", "--max-turns", "0", "argument --max-turns: expected a whole number from 1 to 2147483647"),
    ],
)
def test_numeric_options_out_of_range_are_one_line_errors(capsys, verb, option, value, message):
    args = {"play": ["play", "tictactoe", "--agents", "random,random"], "eval": ["eval", "--checkpoints", "x"]}
    with pytest.raises(SystemExit) as exit_info:
        main([*args[verb], option, value])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith(f"selfplay: error: {message}")
    assert err.count("\n") == 1 and f"(see `selfplay {verb} --help`)" in err


def test_play_reports_a_cooperative_game_by_its_team_score(capsys):
    game = "openspiel:hanabi(players=2, colors=1, ranks=2, hand_size=2, max_information_tokens=3, max_life_tokens=1)"
    code, out, _ = run_cli(capsys, "play", game, "--agents", "random,random", "--episodes", "6", "--no-progress")
    assert code == 0 and "A cooperative game: every player shares one score. Mean team score" in out
    assert "wins" not in out
    summary = json.loads(run_cli(capsys, "play", game, "--agents", "random,random", "--episodes", "6", "--json")[1])
    assert summary["cooperative"] and summary["team_score"] == summary["agents"][0]["mean_reward"]
