"""Whatever a user types or writes in a config, the command line answers with a result (exit 0)
or with one line `selfplay: error: ...` (exit 2): never a traceback, never a half-made run. (A
valid run may still diverge in training, which is no answer to its input: exit 1, with traceback.)

Every verb gets bad values in every option, and `train` gets them in every key of the config
schema (walked from its dataclasses), as overrides and as config files."""

from __future__ import annotations

import dataclasses
import os
import stat
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import SafetensorError

from selfplay.checkpoint import list_checkpoints
from selfplay.cli import main
from selfplay.config import TrainConfig, load_config
from selfplay.errors import UserError
from selfplay.league.manager import initial_players
from selfplay.league.store import LeagueStore
from selfplay.model_specs import ModelSpec
from selfplay.run_dir import RunDir
from selfplay.train import TrainingDiverged, validate

# Wrong types, signs, sizes and syntax, as YAML text for an override or a config value.
BAD_YAML = [
    "-1",
    "0",
    "0.5",
    str(2**64),
    "1e999",
    ".nan",
    "-.inf",
    '""',
    "",  # `key=`: null
    "true",
    "garbage text",
    "[1, 2]",
    "[]",
    "{a: 1}",
    "{}",
    "[",
    "{a: 1, a: 2}",
    "&x [*x]",
    "[" * 40 + "]" * 40,
]
# The same for command-line options, which argparse reads as text.
BAD_TEXT = ["-1", "0", "0.5", str(2**64), "1e999", "nan", "-inf", "", "garbage text", "[1, 2]", "{a: 1}"]
BAD_SPECS = [
    "garbage text",
    "openspiel:",
    "openspiel:no_such_game",
    "openspiel:tic_tac_toe(",
    "openspiel:tic_tac_toe(rows=x)",
    "pettingzoo:",
    "pettingzoo:os",
    "pettingzoo:no.such.module",
    "tictactoe(size=3)",
    "mcts:0",
    "mcts:-1",
    f"mcts:{2**64}",
    "nash:x",
    "random:3",
    "model:",
    "model:/nonexistent",
    "pfsp:nope",
    ",",
]
TINY_RUN = [
    "--no-progress",
    "steps=1",
    "games={tictactoe: 1}",
    "rollout.games_per_step=2",
    "rollout.max_new_tokens=4",
    "rollout.max_turns=4",
    "rollout.prompt=view",
]


def schema_keys(cls=TrainConfig, prefix: str = "") -> list[str]:
    """Every leaf key of the config schema, dotted."""
    keys = []
    for name, hint in typing.get_type_hints(cls).items():
        if dataclasses.is_dataclass(hint):
            keys += schema_keys(hint, f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return keys


def sections(cls=TrainConfig, prefix: str = "") -> list[str]:
    found = [prefix]
    for name, hint in typing.get_type_hints(cls).items():
        if dataclasses.is_dataclass(hint):
            found += sections(hint, f"{prefix}{name}.")
    return found


KEYS = schema_keys()
OVERRIDES = [f"{key}={value}" for key in KEYS for value in BAD_YAML] + [f"{s}no_such_key=1" for s in sections()]


@pytest.fixture(scope="module")
def micro_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model's tokenizer under a one-layer model of width 32: what is fuzzed here is the
    command line, not the model, and each accepted input trains or plays with it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig, Qwen2Config

    tiny = AutoConfig.from_pretrained(tiny_model_dir)
    ids = ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings")
    config = Qwen2Config(
        **{name: getattr(tiny, name) for name in ids},
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig.from_pretrained(tiny_model_dir)
    out = tmp_path_factory.mktemp("models") / "micro"
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty working directory (relative run directories land there), offline from any hub,
    where the default model is never built (that takes minutes: no bad input may lead to it)."""
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setenv("SELFPLAY_HOME", str(tmp_path / "home"))

    def refuse(path):
        raise AssertionError("a fuzzed command set out to build the default model")

    monkeypatch.setattr("selfplay.default_model.build_default_model", refuse)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def run_cli(argv: list[str], capsys) -> int:
    """`selfplay ARGV` in this process: its exit code, having checked that it is 0, or 2 with
    exactly one line of error; 1 for a run that was accepted and diverged (`TrainingDiverged`,
    which the command line shows with its traceback: training failed, not the input)."""
    try:
        code = main(argv)
    except SystemExit as exit:
        code = exit.code
    except TrainingDiverged:
        code = 1
    err = capsys.readouterr().err
    assert code in (0, 1, 2), (argv, code, err)
    if code == 2:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("selfplay: error: "), (argv, err)
    return code


def new_paths(root: Path, before: set[Path]) -> set[Path]:
    return {path for path in root.rglob("*") if path not in before}


def assert_run_dirs_complete(root: Path, before: set[Path], code: int, argv) -> None:
    """A run that could not start made nothing. A run that started has its whole config, and
    each step it saved: all of them if it finished, none if it stopped in its one step (as at a
    non-finite update), and then a new run may take its directory."""
    made = new_paths(root, before)
    configs = [path for path in made if path == RunDir(path.parent).config]
    if not configs:
        assert code == 2 and not made, (argv, sorted(made))
        return
    assert len(configs) == 1, (argv, configs)
    run_dir = configs[0].parent
    load_config(RunDir(run_dir).config)
    assert [p.name for p in list_checkpoints(run_dir)] == (["step-000001"] if code == 0 else []), argv


@pytest.mark.slow
@pytest.mark.parametrize("key", [*KEYS, "no_such_key"])
def test_every_config_key_with_bad_values_trains_or_fails_in_one_line(key, micro_model_dir, workdir, capsys):
    """One key at a time, so that the ~2,000 runs spread over pytest-xdist's workers; that most bad
    values are refused and some accepted, the schema's half checks over them all at once."""
    overrides = [f"{key}={value}" for value in BAD_YAML] if key in KEYS else [f"{s}{key}=1" for s in sections()]
    before = set(workdir.rglob("*"))
    for i, override in enumerate(overrides):
        argv = ["train", *TINY_RUN, f"model={micro_model_dir}", f"run_dir=run{i}", override]
        assert_run_dirs_complete(workdir, before, run_cli(argv, capsys), argv)
        before = set(workdir.rglob("*"))


def test_every_config_key_with_bad_values_is_accepted_or_named(tmp_path):
    """The fast half of the above: the schema and `validate` accept each bad value or raise
    UserError; no other exception, whatever the key and value."""
    accepted = 0
    for override in OVERRIDES:
        try:
            validate(load_config(None, [override]))
            accepted += 1
        except UserError as err:
            assert "\n" not in str(err), override
    assert 0 < accepted < len(OVERRIDES) // 4


CONFIG_FILES = {
    "binary": bytes(range(256)),
    "latin-1": "learner: {lr: 1e-5}  # café".encode("latin-1"),
    "nul": b"steps: 1\x00",
    "empty": b"",
    "a list": b"[steps, 1]\n",
    "a scalar": b"garbage text\n",
    "tabs": b"learner:\n\tlr: 1\n",
    "duplicate key": b"steps: 1\nsteps: 2\n",
    "alias bomb": b"a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    + b"".join(f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n".encode() for p, c in zip("abcdefg", "bcdefgh")),
    "self alias": b"steps: &a [*a]\n",
    "deep": b"steps: " + b"[" * 1000 + b"]" * 1000 + b"\n",
    "huge": b"# padding\n" * 200_000,
    "python tag": b"steps: !!python/object/apply:os.system [echo]\n",
    "unknown tag": b"steps: !thing 1\n",
    "bad key type": b"1: 2\n",
    "key types": b"1: 2\nsteps: 1\n",
}


@pytest.mark.parametrize("content", CONFIG_FILES.values(), ids=CONFIG_FILES.keys())
def test_a_config_file_of_any_content_trains_or_fails_in_one_line(content, micro_model_dir, workdir, capsys):
    path = workdir.parent / "config.yaml"
    path.write_bytes(content)
    before = set(workdir.rglob("*"))
    argv = ["train", str(path), *TINY_RUN, f"model={micro_model_dir}", "run_dir=run"]
    assert_run_dirs_complete(workdir, before, run_cli(argv, capsys), argv)


@settings(
    max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=st.text(max_size=200) | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
def test_any_config_text_is_accepted_or_named(text, tmp_path):
    path = tmp_path / "fuzzed.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    try:
        validate(load_config(path))
    except UserError as err:
        assert "\n" not in str(err)


PLAY_OPTIONS = [
    "--episodes",
    "--seed",
    "--retries",
    "--max-turns",
    "--backend",
    "--temperature",
    "--decoding",
    "--prompt",
    "--max-new-tokens",
    "--observation-mode",
]
EVAL_OPTIONS = [
    "--episodes",
    "--seed",
    "--backend",
    "--temperature",
    "--decoding",
    "--prompt",
    "--max-new-tokens",
    "--max-turns",
]


def play_cases(model: Path) -> list[list[str]]:
    base = ["play", "tictactoe", "--agents", f"model:{model},random", "--episodes", "2", "--no-progress"]
    cases = [[*base, option, value] for option in PLAY_OPTIONS for value in BAD_TEXT]
    cases += [["play", spec, "--agents", "random,random", "--episodes", "2"] for spec in BAD_SPECS]
    cases += [["play", "tictactoe", "--agents", f"{spec},random", "--episodes", "2"] for spec in BAD_SPECS]
    cases += [["play", "tictactoe", "--agents", "random", "--episodes", "2"], ["play", "tictactoe"], ["play"]]
    return cases


def eval_cases(model: Path, files: Path) -> list[list[str]]:
    out = str(files / "eval")
    base = ["eval", "--checkpoints", str(model), "--games", "tictactoe", "--episodes", "1"]
    base += ["--no-round-robin", "--no-exploitability", "--no-progress", "--out", out]
    cases = [[*base, option, value] for option in EVAL_OPTIONS for value in BAD_TEXT]
    cases += [[*base, "--opponents", spec] for spec in BAD_SPECS]
    cases += [[*base, "--games", spec] for spec in BAD_SPECS]
    paths = [
        "/nonexistent",
        str(files / "file"),
        str(files / "file" / "below"),
        str(files / "empty_dir"),
        str(files / "binary.yaml"),
        str(files / "list.yaml"),
        str(files / "bad_suite.yaml"),
        str(files / "x.safetensors"),
        "garbage text",
    ]
    cases += [[*base, "--checkpoints", path] for path in paths]
    cases += [[*base, "--suite", path] for path in [*paths, "nope", ""]]
    cases += [[*base, "--out", path] for path in [str(files / "file"), str(files / "file" / "below")]]
    cases += [["eval", "--checkpoints", str(model)], ["eval", "--games", "tictactoe"], ["eval"]]
    return cases


def league_cases(files: Path) -> list[list[str]]:
    paths = [
        "/nonexistent",
        str(files / "file"),
        str(files / "empty_dir"),
        str(files / "bad_run"),
        str(files / "plain_run"),
        "",
    ]
    cases = [["league", "show", path] for path in [*paths, str(files / "league_run")]]
    league = ["league", "show", str(files / "league_run")]
    cases += [[*league, "--csv", path] for path in [str(files / "file"), str(files / "file" / "below"), ""]]
    cases += [[*league, "--meta", spec] for spec in [*BAD_SPECS, "kuhn_poker", ""]]
    cases += [["league"], ["league", "show"], ["league", "nope"], ["games"], ["games", "nope"]]
    cases += [["games", "list", "extra"], ["nope"], [], ["train", "--resume", str(files / "plain_run")]]
    cases += [["train", "--resume", path] for path in paths]
    return cases


@pytest.fixture
def files(tmp_path, micro_model_dir):
    """Paths that are not what the command line expects: a file, an empty directory, YAML that
    is binary or a list or a bad suite, a run directory with a broken config, and one with a
    config but nothing else."""
    (tmp_path / "file").write_text("not a directory\n")
    (tmp_path / "empty_dir").mkdir()
    (tmp_path / "binary.yaml").write_bytes(bytes(range(256)))
    (tmp_path / "list.yaml").write_text("[games, 1]\n")
    (tmp_path / "bad_suite.yaml").write_text("games: [tictactoe]\nepisodes: -1\n")
    (tmp_path / "x.safetensors").write_bytes(b"garbage")
    (tmp_path / "bad_run").mkdir()
    RunDir(tmp_path / "bad_run").config.write_bytes(b"steps: [\n")
    (tmp_path / "league_run").mkdir()
    RunDir(tmp_path / "league_run").config.write_text(f"model: {micro_model_dir}\nleague: {{enabled: true}}\n")
    store = LeagueStore(RunDir(tmp_path / "league_run").league_store)
    store.add_players(initial_players(load_config(RunDir(tmp_path / "league_run").config)))
    store.close()
    (tmp_path / "plain_run").mkdir()
    RunDir(tmp_path / "plain_run").config.write_text(f"steps: 1\nmodel: {micro_model_dir}\n")
    return tmp_path


@pytest.mark.slow
def test_play_eval_league_and_games_with_bad_arguments_answer_in_one_line(micro_model_dir, files, workdir, capsys):
    cases = [*play_cases(micro_model_dir), *eval_cases(micro_model_dir, files), *league_cases(files)]
    codes = [run_cli(argv, capsys) for argv in cases]
    assert codes.count(2) > codes.count(0) > 0
    assert run_cli(["games", "list"], capsys) == 0


# Game specs OpenSpiel accepts but cannot serve: text that is not UTF-8 (boards past 26 columns
# or rows), states too large to hold (a pile of 10^8 in nim; 10^8 bids; 10^8 chance outcomes)
# or to prompt (a 100 x 100 dots-and-boxes grid), and parameters it refuses on its first state.
UNSERVABLE_SPECS = {
    "openspiel:breakthrough(columns=32)": "not UTF-8",
    "openspiel:hex(board_size=200)": "not UTF-8",
    "openspiel:nim(pile_sizes=100000000;3)": "200,000,001 distinct moves",
    "nim(pile_sizes=100000000;3)": "200,000,001 distinct moves",
    "openspiel:first_sealed_auction(max_value=100000000)": "100,000,000 distinct moves",
    "openspiel:connect_four(rows=1000,columns=1000)": "3,000,000 numbers in an observation tensor",
    "openspiel:dots_and_boxes(num_rows=100,num_cols=100)": "too large to prompt",
    "openspiel:go(board_size=100)": "supports board size up to 19",
}


@pytest.mark.parametrize("spec", UNSERVABLE_SPECS)
def test_a_game_openspiel_cannot_serve_is_refused_by_play_train_and_eval_before_anything_is_written(
    spec, micro_model_dir, workdir, capsys
):
    before = set(workdir.rglob("*"))
    commands = [
        ["play", spec, "--agents", "random,random", "--episodes", "1", "--no-progress"],
        ["train", *TINY_RUN, f"model={micro_model_dir}", "run_dir=run", f"games={{'{spec}': 1}}"],
        ["eval", "--checkpoints", str(micro_model_dir), "--games", spec, "--no-progress", "--out", "eval"],
    ]
    for argv in commands:
        assert main(argv) == 2, argv
        assert UNSERVABLE_SPECS[spec] in capsys.readouterr().err, argv
    assert new_paths(workdir, before) <= {workdir / "eval"}  # eval makes its output directory first


def test_export_onto_a_full_disk_is_one_line_and_leaves_nothing(micro_model_dir, workdir, monkeypatch, capsys):
    def disk_fills_up(tensors, filename, *args, **kwargs):
        Path(filename).write_bytes(b"half a file")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr("transformers.modeling_utils.safe_save_file", disk_fills_up)
    assert run_cli(["export", str(micro_model_dir), "out/model"], capsys) == 2
    assert list(workdir.rglob("*")) == [workdir / "out"]


def test_export_keeps_what_it_did_not_write_and_makes_its_directory_as_any_other(
    micro_model_dir, workdir, monkeypatch, capsys
):
    """A file put into the empty target while the model loads is kept, and the model not written
    there; a new or empty target gets a new directory's permissions (the umask's), and its files a
    new file's."""
    network = ModelSpec.network

    def network_while_a_file_arrives(self, *args, **kwargs):
        (workdir / "raced" / "notes.txt").write_text("the user's own\n")
        return network(self, *args, **kwargs)

    (workdir / "raced").mkdir()
    with monkeypatch.context() as patched:
        patched.setattr(ModelSpec, "network", network_while_a_file_arrives)
        assert run_cli(["export", str(micro_model_dir), "raced"], capsys) == 2
    assert [path.name for path in workdir.iterdir()] == ["raced"]
    assert [path.name for path in (workdir / "raced").iterdir()] == ["notes.txt"]
    (workdir / "empty").mkdir()
    umask = os.umask(0o027)
    try:
        for target in ("empty", "new"):
            assert run_cli(["export", str(micro_model_dir), target], capsys) == 0
            assert stat.S_IMODE((workdir / target).stat().st_mode) == 0o750
            # Every file as a new file gets, the weights too (safetensors writes them 0600).
            files = list((workdir / target).iterdir())
            assert {stat.S_IMODE(path.stat().st_mode) for path in files} == {0o640}
            assert "model.safetensors" in {path.name for path in files}
    finally:
        os.umask(umask)


def test_an_interrupt_is_one_line_with_exit_code_130(monkeypatch, capsys):
    """Ctrl-C: the command cleans up as it stops (a sharded learner's processes included), and
    the command line says so in one line, not a traceback."""
    from selfplay import cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_cmd_games_list", interrupted)
    assert main(["games", "list"]) == 130
    assert capsys.readouterr().err == "selfplay: interrupted\n"
