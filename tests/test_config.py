"""Training configs: YAML plus dotted overrides, validated before any work."""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import pytest

from selfplay.cli import main
from selfplay.config import LoraConfig, TrainConfig, find_yaml, load_config
from selfplay.errors import UserError
from selfplay.train import validate

ROOT = Path(__file__).parent.parent
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


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
        ("games={tictactoe: -1}", "Bad value for 'games.tictactoe': expected a number from 0 to"),
        ("games=[tictactoe, tictactoe]", "'tictactoe' is listed twice"),
        ("learner.lr=inf", "Bad value for 'learner.lr': expected a number from 0 to 1, got 'inf'"),
        ("learner.lr=.nan", "Bad value for 'learner.lr'"),
        ("learner.lr=-1", "Bad value for 'learner.lr'"),
        ("learner.lr=1e999", "Bad value for 'learner.lr'"),
        ("learner.clip=-1", "Bad value for 'learner.clip': expected a number above 0"),
        ("learner.micro_batch_tokens=0", "Bad value for 'learner.micro_batch_tokens': expected a whole number from 1"),
        ("rollout.temperature=-1", "Bad value for 'rollout.temperature': expected a number at least 0"),
        ("rollout.top_p=0", "Bad value for 'rollout.top_p': expected a number above 0 and at most 1"),
        ("rollout.max_turns=0", "Bad value for 'rollout.max_turns'"),
        ("checkpoint_every=0", "Bad value for 'checkpoint_every'"),
        ("steps=18446744073709551616", "Bad value for 'steps': expected a whole number from 1 to 2147483647"),
        ("seed=-1", "Bad value for 'seed': expected a whole number from 0 to 4294967295"),
        ("max_minutes=0", "Bad value for 'max_minutes'"),
        ("eval.episodes=0", "Bad value for 'eval.episodes'"),
        ("learner.lora.target_modules=[]", "target_modules must name at least one module"),
        ("steps=[1", r"Override 'steps=\[1' is not valid YAML: .* \(line 1, column 3\)"),
        ("games={a: 1, a: 2}", "the key 'a' is given twice in one mapping"),
        ("steps=&a [*a]", r"the alias \*a lies inside its own anchor"),
        ("steps=" + "[" * 40 + "]" * 40, "values nest more than 32 levels deep"),
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
        (["device=tpu"], "Bad value for 'device': 'tpu' is not a torch device"),
        (["device=meta"], "this machine has no meta device"),
    ],
)
def test_what_needs_the_registries_is_checked_before_work(overrides, message):
    config = load_config(None, overrides)
    with pytest.raises(UserError, match=message):
        validate(config)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["advantages.estimator=grpo"], "group_size"),
        (["advantages.group_size=3"], "multiple of advantages.group_size"),
        (["advantages.turn_discount=0"], r"'advantages.turn_discount': expected a number above 0 and at most 1"),
        (["advantages.state_prior=-1"], "'advantages.state_prior': expected a number at least 0, got -1"),
        (["advantages.estimator=trr++", "advantages.state_prior=4"], "state_prior=4.0 needs advantages.estimator=rae"),
        (["advantages.valid_turn_bonus=0.05"], "valid_turn_bonus=0.05 needs advantages.estimator=turn_level"),
        (["league.snapshot_min_games=100"], "snapshot_min_games=100 can never be reached: with league.payoff_decay"),
        (["learner.lora.dropout=0.3"], "'learner.lora.dropout' is no longer a setting: the learner trains with every"),
        (["learner.reference_update_every=10"], "set learner.kl_coef above 0"),
        (["learner.kl_coef=0.1", "learner.reference_update_rate=0.1"], "set learner.reference_update_every"),
        (["learner.reference_update_rate=0"], "'learner.reference_update_rate': expected a number above 0"),
        (["learner.kl_schedule=linear"], "kl_schedule=linear anneals learner.kl_coef, which is 0"),
        (["rollout.decoding=legal", "rollout.top_p=0.9"], "rollout.top_p applies to free decoding only"),
        (["league.exploiter_keep_best=true"], "keep_best=true needs the exact values .*it has snapshot"),
        (["league.exploiter_games_at_value=0.05"], "games_at_value needs the exact values .* set it, or drop"),
        (["league.exploiter_admit=beats_mixture", "league.exploiter_stop=plateau"], "it has plateau"),
        (["league.exploiter_reference=start"], "are the initial model's unless league.exploiter_init=main"),
        (
            ["league.exploiter_reference=start", "league.exploiter_init=main", "league.exploiter_lora_rank=0"],
            "by their KL penalty, which is 0: set league.exploiter_kl_coef above 0",
        ),
        (
            ["league.enabled=true", "league.main_exploiters=2", "league.population_cap=2"],
            "population_cap=2 is below the 3 learning players",
        ),
    ],
)
def test_settings_that_do_not_fit_together_are_refused_by_the_schema(overrides, message):
    with pytest.raises(UserError, match=message):
        load_config(None, overrides)


def test_a_retired_setting_at_the_value_the_code_keeps_loads_as_older_run_directories_saved_it(tmp_path):
    saved = tmp_path / "config.yaml"
    saved.write_text("learner:\n  lora: {rank: 4, alpha: 8.0, dropout: 0.0}\n")
    assert load_config(saved).learner.lora == LoraConfig(rank=4, alpha=8.0)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe\x00steps: 3", "is not UTF-8 text"),
        (b"steps: 3\x00\n", "character #x0000 at position 8 is not allowed"),
        (b"steps: 3\nlearner: {lr: 1.0e-4}\nsteps: 4\n", r"the key 'steps' is given twice in one mapping \(line 3"),
        (b"learner:\n  lr: 1.0e-4\n  lr: 1.0e-3\n", "the key 'lr' is given twice"),
        (b"steps: [\n", "is not valid YAML"),
        (b"a: &a [*a]\n", "lies inside its own anchor"),
        (b"# a comment\n" * 100_000, "is larger than 1 MiB"),
    ],
)
def test_a_config_file_that_is_not_a_small_yaml_mapping_is_named(tmp_path, content, message):
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    with pytest.raises(UserError, match=message):
        load_config(path)


def test_yaml_aliases_may_share_values_but_not_expand_without_bound(tmp_path):
    shared = tmp_path / "shared.yaml"
    shared.write_text("opponents: &mix {self: 1, random: 1}\nleague: {role_opponents: {a: *mix, b: *mix}}\n")
    assert load_config(shared).league.role_opponents == {
        "a": {"self": 1.0, "random": 1.0},
        "b": {"self": 1.0, "random": 1.0},
    }
    merged = tmp_path / "merged.yaml"
    merged.write_text("learner:\n  <<: {lr: 1.0e-3, clip: 0.1}\n  lr: 1.0e-4\n")  # a merge key may be overridden
    assert (load_config(merged).learner.lr, load_config(merged).learner.clip) == (1e-4, 0.1)
    # "Billion laughs": nine levels of nine aliases each would expand to 387 million values.
    levels = ["l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(levels) + "\n")
    with pytest.raises(UserError, match="its aliases expand it beyond 10000 values"):
        load_config(bomb)


@pytest.mark.slow
@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_validate(path):
    validate(load_config(path))


def test_recipes_are_found_by_name_from_the_installed_package(capsys):
    assert [find_yaml(path.stem, "recipe").read_bytes() for path in CONFIGS] == [path.read_bytes() for path in CONFIGS]
    assert find_yaml("runs/mine.yml", "recipe") == Path("runs/mine.yml")  # a file is itself
    names = ", ".join(path.stem for path in CONFIGS)
    with pytest.raises(UserError, match=f"Unknown recipe 'configs/quickstart': .* or one of {names}.$"):
        find_yaml("configs/quickstart", "recipe")
    assert main(["train", "nope", "steps=1"]) == 2
    assert f"Unknown recipe 'nope': give a YAML file (NAME.yaml), or one of {names}." in capsys.readouterr().err


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


def schema_fields(cls=TrainConfig, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, field name) of every field of the schema, sections included."""
    found = []
    for name, hint in typing.get_type_hints(cls).items():
        found.append((f"{prefix}{name}", name))
        if dataclasses.is_dataclass(hint):
            found += schema_fields(hint, f"{prefix}{name}.")
    return found


def test_every_config_field_is_read_outside_the_schema():
    """A setting the code never reads is a setting that silently does nothing (as
    league.exploiter_lr once did): every field must be read as an attribute somewhere in the
    package, the schema's own module aside."""
    read = set()
    for package in ("selfplay", "games", "roles", "evaluation"):
        for path in (ROOT / package).rglob("*.py"):
            if path != ROOT / "selfplay" / "config.py":
                tree = ast.parse(path.read_text(encoding="utf-8"))
                read |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert [key for key, name in schema_fields() if name not in read] == []
