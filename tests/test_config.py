"""Training configs: YAML plus dotted overrides, validated before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from selfplay.cli import main
from selfplay.config import TrainConfig, load_config
from selfplay.errors import UserError
from selfplay.train import validate

CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.yaml"))


def test_defaults_overrides_and_nested_sections(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("steps: 7\nlearner:\n  lr: 1.0e-4\n  lora: {rank: 4}\ngames: [tictactoe, kuhn_poker]\n")
    config = load_config(path, ["learner.lr=1e-5", "rollout.temperature=0.7", "opponents={self: 3, random: 1}"])
    assert config.steps == 7
    assert config.learner.lr == 1e-5  # YAML reads 1e-5 as text; the schema makes it a number
    assert config.learner.lora.rank == 4 and config.learner.lora.alpha == 16.0
    assert config.rollout.temperature == 0.7
    assert config.games == {"tictactoe": 1.0, "kuhn_poker": 1.0}
    assert config.opponents == {"self": 3.0, "random": 1.0}
    assert load_config(None) == TrainConfig()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("learner.lrr=1", "Unknown config key 'learner.lrr'"),
        ("stepz=3", "Unknown config key 'stepz'"),
        ("learner.loss=ppo2", "Bad value for 'learner.loss'"),
        ("backend_precision=fp16", "Bad value for 'backend_precision'.*fp32, bf16"),
        ("steps=-1", "Bad value for 'steps'"),
        ("steps=two", "Bad value for 'steps'"),
        ("rollout.temperature=warm", "Bad value for 'rollout.temperature'"),
        ("games={}", "Bad value for 'games'"),
        ("games={tictactoe: -1}", "Bad value for 'games'"),
        ("learner=3", "'learner' must be a section"),
        ("learner.lr.x=3", "Bad value for 'learner.lr'"),
        ("nonsense", "must look like key=value"),
        ("rollout.prompt=short", "Bad value for 'rollout.prompt'"),
    ],
)
def test_bad_keys_and_values_are_named(override, message):
    with pytest.raises(UserError, match=message):
        load_config(None, [override])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["games={chess: 1}"], "Unknown game 'chess'"),
        (["opponents={self: 1, grandmaster: 1}"], "Unknown agent 'grandmaster'"),
        (["games={negotiation: 1}", "opponents={mcts: 1}"], "mcts"),
        (["advantages.estimator=grpo"], "group_size"),
        (["advantages.group_size=3"], "multiple of advantages.group_size"),
        (["advantages.turn_discount=0"], r"turn_discount must lie in \(0, 1\]"),
        (["advantages.state_prior=-1"], "state_prior=-1.0 needs advantages.estimator=rae and a value of at least 0"),
        (["advantages.estimator=trr++", "advantages.state_prior=4"], "state_prior=4.0 needs advantages.estimator=rae"),
        (["learner.reference_update_every=10"], "set learner.kl_coef above 0"),
        (["learner.kl_coef=0.1", "learner.reference_update_every=10", "learner.lora.rank=4"], "lora.rank=0"),
    ],
)
def test_semantic_errors_are_caught_before_work(overrides, message):
    with pytest.raises(UserError, match=message):
        validate(load_config(None, overrides))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_validate(path):
    validate(load_config(path))


def test_cli_reports_a_bad_key_in_one_line(tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text("learner: {lrate: 0.1}\n")
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Unknown config key 'learner.lrate'" in err
    assert main(["train", str(tmp_path / "missing.yaml")]) == 2
    assert "Cannot read config" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path / "nowhere")]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_cli_reads_overrides_written_after_an_option(tmp_path, capsys):
    config = tmp_path / "good.yaml"
    config.write_text("steps: 3\n")
    assert main(["train", str(config), "--no-progress", "learner.lrate=0.1"]) == 2
    assert "Unknown config key 'learner.lrate'" in capsys.readouterr().err
    assert main(["train", "--no-progress", "learner.lrate=0.1"]) == 2
    assert "Unknown config key 'learner.lrate'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", str(config), "--no-progress", "--bogus"])
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
