"""Model specs: one rule for what names a model (a run, a checkpoint, a league player, a model
directory), models played as their run trained them unless an option says otherwise, models as
eval opponents, and `selfplay export`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from selfplay.backends.hf_backend import merged_adapter_weights
from selfplay.cli import main
from selfplay.config import load_config
from selfplay.errors import UserError
from selfplay.model_specs import model_directory, model_spec
from selfplay.rollouts import RolloutSettings
from selfplay.run_dir import RunDir
from selfplay.train import Trainer, train_command

# A league run of the tiny model as configs/tictactoe.yaml asks a small model: legal decoding, the
# state alone. Its policy then writes no invalid move, and free decoding hardly ever a valid one.
# The main player and its exploiter train LoRA adapters.
LEGAL_VIEW_LEAGUE = [
    "steps=1",
    "checkpoint_every=1",
    "games={kuhn_poker: 1}",
    "rollout.games_per_step=4",
    "rollout.max_new_tokens=8",
    "rollout.decoding=legal",
    "rollout.prompt=view",
    "learner.lr=1e-2",
    "learner.lora.rank=2",
    "league.enabled=true",
    "league.scripted=[random]",
    "league.main_exploiters=1",
    "league.snapshot_every=1",
    "league.exploiter_lora_rank=2",
    "league.exploiter_lr=0.05",
]
EVAL = ["--games", "kuhn_poker", "--no-round-robin", "--no-exploitability", "--no-progress"]


@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("specs") / "run"
    train_command(None, [*LEGAL_VIEW_LEAGUE, f"model={tiny_model_dir}", f"run_dir={run_dir}"], None, progress=False)
    return run_dir


def test_a_run_names_its_newest_checkpoint_with_the_settings_it_was_trained_with(run):
    newest = model_spec(str(run))
    checkpoint = str(RunDir(run).checkpoints / "step-000001")
    assert (newest.name, newest.model, newest.step) == ("run/step-000001", checkpoint, 1)
    assert model_spec(newest.model) == newest
    assert (newest.trained_with.decoding, newest.trained_with.prompt, newest.trained_with.max_new_tokens) == (
        "legal",
        "view",
        8,
    )
    # An option wins over the run's setting; the run's win over the command's defaults.
    played = newest.played_with(RolloutSettings(max_turns=5), fixed={"decoding"})
    assert (played.sampling.decoding, played.prompt, played.sampling.max_new_tokens, played.max_turns) == (
        "free",
        "view",
        8,
        5,
    )
    assert model_spec(str(RunDir(run).adapter_snapshot("main@000001"))).trained_with == newest.trained_with


def test_the_default_model_is_asked_as_it_learned_unless_an_option_says_otherwise():
    """The built-in model learned legal moves, not to write them: play and eval decode it legally,
    on the state alone, as its build record says."""
    default = model_spec("default")
    played = default.played_with(RolloutSettings())
    assert (played.sampling.decoding, played.prompt) == ("legal", "view")
    asked_free = default.played_with(RolloutSettings(prompt="full"), fixed={"decoding", "prompt"})
    assert (asked_free.sampling.decoding, asked_free.prompt) == ("free", "full")


def test_league_players_are_models_by_their_league_names(run, tiny_model_dir):
    snapshot = model_spec(f"{run}@main@000001")
    adapter = RunDir(run).adapter_snapshot("main@000001")  # a LoRA learner's snapshot: its adapter
    assert (snapshot.name, snapshot.step, snapshot.weights) == ("main@000001", 1, str(adapter))
    assert model_spec(str(adapter)) == snapshot
    assert snapshot.model == str(tiny_model_dir)  # the run's initial model, which the adapter applies to
    served = snapshot.policy()
    assert served.version == 1
    merged = merged_adapter_weights(tiny_model_dir, adapter)
    assert all(torch.equal(served.model.state_dict()[k], v) for k, v in merged.items())
    network, _ = snapshot.network()
    assert all(torch.equal(network.state_dict()[k], v) for k, v in merged.items())
    served.close()
    assert model_spec(f"{run}@main") == model_spec(str(run))
    exploiter = model_spec(f"{run}@main_exploiter_0")
    assert exploiter.name == "run/step-000001/exploiters/main_exploiter_0" and exploiter.trained_with is not None


@pytest.mark.parametrize(
    "spec, message",
    [
        ("{run}@random", "'random' is a scripted agent of the league of '{run}', not a model: give it as the agent"),
        ("{run}@nobody", "No player 'nobody' in the league of '{run}'. Its models: main, main_exploiter_0, main@0"),
        ("{run}/checkpoints/step-000009", "No checkpoint '{run}/checkpoints/step-000009': the run '{run}' holds step-"),
    ],
)
def test_a_spec_naming_no_model_says_what_there_is(run, spec, message):
    with pytest.raises(UserError) as refused:
        model_spec(spec.format(run=run))
    assert message.format(run=run) in str(refused.value)


def test_a_damaged_checkpoint_or_snapshot_and_a_run_without_a_league_are_refused_clearly(run, tmp_path):
    copy = RunDir(shutil.copytree(run, tmp_path / "copy"))
    weights = copy.checkpoints / "step-000001" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(UserError, match="step-000001' is damaged \\(model.safetensors is unreadable"):
        model_spec(str(copy.checkpoints / "step-000001"))
    snapshot = copy.adapter_snapshot("main@000001") / "adapter_model.safetensors"
    snapshot.write_bytes(snapshot.read_bytes()[:100])
    with pytest.raises(UserError, match="weights of league player 'main@000001' .* are missing or damaged"):
        model_spec(f"{copy.path}@main@000001")
    copy.league_store.unlink()
    with pytest.raises(UserError, match="holds no league \\(league.sqlite is missing\\), so it has no player 'main'"):
        model_spec(f"{copy.path}@main")


def test_eval_plays_a_run_as_it_was_trained_unless_an_option_says_otherwise(run, tmp_path, capsys):
    """The README's `selfplay eval --checkpoints RUN_DIR` with default options, of a run trained
    with legal decoding and the state alone: no invalid move. `--decoding free` wins over the
    run's setting, and its invalid moves are flagged on the terminal and atop the report."""
    base = ["eval", "--checkpoints", str(run), *EVAL, "--episodes", "4"]
    assert main([*base, "--out", str(tmp_path / "default")]) == 0
    results = json.loads((tmp_path / "default" / "results.json").read_text())
    (candidate,) = results["candidates"]
    assert candidate["as_recorded"] and candidate["played_with"]["decoding"] == "legal"
    assert candidate["played_with"]["prompt"] == "view" and candidate["played_with"]["max_new_tokens"] == 8
    assert [row["invalid_move_rate"] for row in results["matches"]] == [0.0]
    report = (tmp_path / "default" / "report.md").read_text()
    assert "| run/step-000001 | yes | legal | view | single_turn | 1.0 | 1.0 | 8 |" in report
    assert "Warning" not in report and "warning" not in capsys.readouterr().err

    assert main([*base, "--decoding", "free", "--out", str(tmp_path / "free")]) == 0
    results = json.loads((tmp_path / "free" / "results.json").read_text())
    played = results["candidates"][0]["played_with"]
    assert (played["decoding"], played["prompt"]) == ("free", "view")
    (row,) = results["matches"]
    assert row["invalid_move_rate"] > 0.2
    err = capsys.readouterr().err
    alarm = f"kuhn_poker, run/step-000001 against random: run/step-000001 made {row['invalid_move_rate']:.0%} invalid"
    assert "more than 20% of a model's moves were invalid" in err and alarm in err
    report = (tmp_path / "free" / "report.md").read_text()
    assert report.startswith("# Evaluation report\n\n> **Warning:** more than 20%") and alarm in report


def test_eval_takes_models_as_opponents_each_asked_as_it_was_trained(run, tmp_path):
    out = tmp_path / "eval"
    candidates = [f"{run}@main@000000", f"{run}@main@000001"]
    argv = ["eval", "--checkpoints", *candidates, "--games", "kuhn_poker", "--opponents", "model:default,random"]
    assert (
        main([*argv, "--episodes", "2", "--no-round-robin", "--no-exploitability", "--no-progress", "--out", str(out)])
        == 0
    )
    results = json.loads((out / "results.json").read_text())
    (opponent,) = results["model_opponents"]
    assert opponent["name"] == "model:default" and opponent["as_recorded"]  # its build record
    assert (opponent["played_with"]["decoding"], opponent["played_with"]["prompt"]) == ("legal", "view")
    rows = {(row["candidate"], row["opponent"]): row for row in results["matches"]}
    assert set(rows) == {(c, o) for c in ("main@000000", "main@000001") for o in ("model:default", "random")}
    assert all(row["invalid_move_rate"] == 0.0 for row in rows.values())  # the candidates decode legally
    assert 0.0 <= rows["main@000001", "model:default"]["opponent_invalid_move_rate"] <= 1.0
    assert "opponent_invalid_move_rate" not in rows["main@000001", "random"]
    assert "opponent's invalid moves" in (out / "report.md").read_text()


def test_human_is_no_eval_opponent(run, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    help_text = capsys.readouterr().out
    assert "human" not in help_text and "model:SPEC" in help_text
    argv = ["eval", "--checkpoints", str(run), *EVAL, "--opponents", "random,human", "--out", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "'human' plays in the terminal, one move at a time, but eval plays its games unattended" in err
    assert "selfplay play GAME --agents human,model:SPEC" in err


def test_a_training_run_evaluates_against_scripted_agents_only(run, tiny_model_dir, tmp_path):
    settings = [f"model={tiny_model_dir}", f"run_dir={tmp_path / 'new'}", "eval.every=1"]
    with pytest.raises(UserError, match="eval.opponents names the model model:default: a run evaluates its policy"):
        Trainer(load_config(None, [*settings, "eval.opponents=[random, 'model:default']"]), progress=False)
    with pytest.raises(UserError, match="'human' plays in the terminal"):
        Trainer(load_config(None, [*settings, "eval.opponents=[human]"]), progress=False)
    assert not (tmp_path / "new").exists()


def test_play_takes_a_run_and_plays_it_as_it_was_trained(run, capsys):
    argv = ["play", "kuhn_poker", "--agents", f"model:{run},random", "--episodes", "6", "--json", "--no-progress"]
    invalid = {}
    for options in ([], ["--decoding", "free"]):
        assert main([*argv, *options]) == 0
        agents = {agent["agent"]: agent for agent in json.loads(capsys.readouterr().out)["agents"]}
        invalid[tuple(options)] = agents[f"model:{run}"]["invalid_moves"]
    assert invalid[()] == 0 and invalid["--decoding", "free"] > 3  # of the model's 6 or more moves


def test_export_writes_any_spec_as_a_standalone_model_directory(run, tiny_model_dir, tmp_path, capsys):
    checkpoint = RunDir(run).checkpoints / "step-000001"
    for index, (spec, weights) in enumerate(
        [
            (str(run), checkpoint / "model.safetensors"),  # LoRA adapters, merged in
            (f"{run}@main@000001", None),  # an adapter, merged into the initial model
            (f"{run}@main_exploiter_0", checkpoint / "exploiters" / "main_exploiter_0" / "model.safetensors"),
        ]
    ):
        out = tmp_path / str(index)
        assert main(["export", spec, str(out)]) == 0
        assert f"Wrote {model_spec(spec).name} to {out}" in capsys.readouterr().out
        exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
        if weights is None:
            tensors = merged_adapter_weights(tiny_model_dir, RunDir(run).adapter_snapshot("main@000001"))
        else:
            tensors = load_file(str(weights))
        assert all(torch.equal(exported[name], tensor) for name, tensor in tensors.items())
        assert not (out / "adapter").exists()
        # Played as the run was: the export records how.
        assert model_spec(str(out)).trained_with == model_spec(str(run)).trained_with
    # The checkpoint's weights are the adapters merged into the initial model, which export keeps.
    assert (checkpoint / "adapter").is_dir()
    initial = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(load_file(str(checkpoint / "model.safetensors"))[name], initial[name])
    assert main(["export", str(run), str(tmp_path / "0")]) == 2
    assert "already exists and is not an empty directory" in capsys.readouterr().err


def test_training_starts_from_a_league_player_exported_once(run, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SELFPLAY_HOME", str(tmp_path))
    directory = model_directory(f"{run}@main@000001")
    assert directory.startswith(str(tmp_path / "models" / "snapshots"))
    weights = merged_adapter_weights(tiny_model_dir, RunDir(run).adapter_snapshot("main@000001"))
    loaded = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).state_dict()
    assert all(torch.equal(loaded[name], tensor) for name, tensor in weights.items())
    monkeypatch.setattr("selfplay.model_specs._write_model", lambda *args: pytest.fail("exported again"))
    assert model_directory(f"{run}@main@000001") == directory
