"""Transcripts (`selfplay play/eval --transcripts`, `play --show`) and play's invalid-move flag."""

import json

from selfplay.cli import main
from selfplay.config import RolloutConfig
from selfplay.match import play_series
from selfplay.rollouts import RolloutSettings
from selfplay.transcripts import transcript


def test_a_transcript_holds_every_turn_of_a_game(tiny_model_dir):
    """Between two models, every move of a game is a model turn: its valid turns are the game's
    moves, its invalid ones the game's invalid moves, in the order they were taken."""
    models = [f"model:{tiny_model_dir}"] * 2
    kept = []
    for decoding, retries in (("legal", 0), ("free", 2)):  # every move valid; invalid answers retried
        results = play_series(
            "kuhn_poker",
            models,
            4,
            seed=1,
            rollout=_rollout(decoding, retries),
            progress=False,
            on_game=lambda trajectory, lineup: kept.append(transcript(trajectory, lineup.players, prompts=True)),
        )
        for result, record in zip(results, kept[-len(results) :]):
            assert (record["game"], record["seed"], record["moves"]) == (result.game, result.seed, result.turns)
            assert record["players"] == list(result.players) and record["rewards"] == list(result.rewards)
            valid = [turn for turn in record["turns"] if not turn["invalid"]]
            assert len(valid) == result.turns
            assert [sum(t["invalid"] for t in record["turns"] if t["seat"] == s) for s in (0, 1)] == list(
                result.invalid_moves
            )
            assert all(turn["answer"] in ("check", "bet", "call", "fold") for turn in valid)
            assert all(turn["invalid_reason"] for turn in record["turns"] if turn["invalid"])
            assert all("Your card" in turn["prompt"] for turn in record["turns"])
    assert any(len(record["turns"]) >= 2 for record in kept) and any(t["invalid"] for r in kept for t in r["turns"])


def _rollout(decoding: str, retries: int) -> RolloutSettings:
    return RolloutSettings.from_config(RolloutConfig(decoding=decoding, retries=retries, max_new_tokens=8))


def test_play_saves_and_shows_transcripts_and_flags_a_model_that_writes_invalid_moves(tiny_model_dir, tmp_path, capsys):
    path = tmp_path / "new" / "games.jsonl"
    args = ["play", "kuhn_poker", "--agents", f"model:{tiny_model_dir},random", "--episodes", "3", "--no-progress"]
    assert main([*args, "--max-new-tokens", "8", "--show", "--transcripts", str(path)]) == 0
    out, err = capsys.readouterr()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 3 and not path.with_name("games.jsonl.partial").exists()
    # The untrained model writes no legal move: each game ends on its first answer.
    assert [len(r["turns"]) for r in records] == [1, 1, 1] and all(r["turns"][0]["invalid"] for r in records)
    first = records[0]["turns"][0]
    assert f"seat {first['seat']} model:{tiny_model_dir} wrote (invalid: {first['invalid_reason']}):" in out
    assert "warning: more than 20% of a model's moves were invalid in the games below" in err
    assert f"kuhn_poker: model:{tiny_model_dir} made 100% invalid moves, asked with decoding free" in err
    assert "(--decoding legal writes only legal moves in this game)" in err and "rollout.format_credit" in err

    assert main([*args, "--decoding", "legal"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_transcripts_onto_a_directory_are_refused_before_playing(tmp_path, capsys):
    assert main(["play", "kuhn_poker", "--agents", "random,random", "--transcripts", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"selfplay: error: --transcripts {tmp_path} is a directory: give a file to write, e.g. " + (
        f"{tmp_path / 'games.jsonl'}.\n"
    )


def test_eval_saves_a_transcript_of_each_game_naming_the_checkpoint(tiny_model_dir, tmp_path, capsys):
    path = tmp_path / "games.jsonl"
    args = ["eval", "--checkpoints", str(tiny_model_dir), "--games", "kuhn_poker", "--episodes", "2", "--no-progress"]
    options = ["--max-new-tokens", "8", "--no-exploitability", "--out", str(tmp_path / "eval"), "--transcripts"]
    assert main([*args, *options, str(path)]) == 0
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [record["players"] for record in records] == [
        [str(tiny_model_dir), "random"],
        ["random", str(tiny_model_dir)],
    ]
    assert all(turn["agent"] == str(tiny_model_dir) and "prompt" not in turn for r in records for turn in r["turns"])
