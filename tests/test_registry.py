import re
from pathlib import Path

import pytest
from pettingzoo.test import api_test, seed_test

from selfplay.cli import main
from selfplay.errors import UserError
from selfplay.games import make_env, make_game, registry
from selfplay.games.registry import UnknownGameError, builtin_games, parse_spec, registered_games

GAMES_DIR = Path(__file__).resolve().parents[1] / "games"
README = GAMES_DIR / "README.md"
ROLE_GAMES = ["secret_keeping", "proposer_solver", "arithmetic"]


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("tictactoe", (None, "tictactoe", {})),
        ("nim(pile_sizes=[3, 4, 5], misere=False)", (None, "nim", {"pile_sizes": [3, 4, 5], "misere": False})),
        ("openspiel:leduc_poker", ("openspiel", "leduc_poker", {})),
        (
            "openspiel:nim(pile_sizes=1;3;5, is_misere=true)",
            ("openspiel", "nim", {"pile_sizes": "1;3;5", "is_misere": True}),
        ),
        ("pettingzoo:pettingzoo.classic.connect_four_v3", ("pettingzoo", "pettingzoo.classic.connect_four_v3", {})),
        (" liars_dice( numdice = 2 ) ", (None, "liars_dice", {"numdice": 2})),
    ],
)
def test_parse_spec(spec, expected):
    assert parse_spec(spec) == expected


@pytest.mark.parametrize(
    "spec, message",
    [
        ("chess_960", "Unknown game 'chess_960'. Games: tictactoe, connect_four"),
        ("steam:portal", "Unknown adapter 'steam:'"),
        ("tictactoe(size)", "'size' in 'tictactoe(size)' is not key=value"),
        ("tictactoe(size=4)", "Game 'tictactoe' has no parameter 'size'; its parameters: none."),
        ("openspiel:no_such_game", "OpenSpiel has no game 'no_such_game'"),
        ("openspiel:tic_tac_toe(rows=3)", "OpenSpiel game 'tic_tac_toe' has no parameter 'rows'"),
        ("openspiel:blackjack", "has 1 player; self-play needs 2 or more"),
        ("not a spec!", "is not a game spec"),
    ],
)
def test_bad_specs_name_the_cause(spec, message):
    with pytest.raises(UserError) as err:
        make_game(spec)
    assert message in str(err.value)


def test_every_builtin_game_is_registered_first_and_described():
    games = registered_games()
    assert list(games)[: len(builtin_games())] == builtin_games()
    for name in builtin_games():
        assert (games[name]().__doc__ or "").strip(), f"{name} needs a one-line description"


def test_games_never_name_roles():
    """roles/ is built on games/, never the other way round."""
    sources = [path for path in GAMES_DIR.rglob("*") if path.is_file() and "__pycache__" not in path.parts]
    assert [path.name for path in sources if "selfplay.roles" in path.read_text(errors="replace")] == []


@pytest.mark.parametrize("name", ROLE_GAMES)
def test_role_games_live_in_roles_and_are_built_in(name):
    assert type(make_game(name)).__module__ == f"selfplay.roles.{name}"
    assert name in builtin_games()


def test_an_install_without_the_role_games_entry_points_says_to_reinstall(monkeypatch, capsys):
    monkeypatch.setattr(registry, "_game_entry_points", lambda: ())
    with pytest.raises(UnknownGameError, match=r"role games.*pip install -e \."):
        make_game("secret_keeping")
    assert main(["games", "list"]) == 0
    assert "pip install -e ." in capsys.readouterr().err


def readme_example(section: str = "Adding a game") -> str:
    """The first Python example of a section of games/README.md."""
    text = README.read_text().split(f"## {section}\n", 1)[1]
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


@pytest.fixture
def installed_example_package(install_game_package):
    """The README's worked example, installed as a third-party package with an entry point."""
    install_game_package("race", readme_example(), "race_to_21 = my_games.race:RaceTo21")


def test_readme_example_registers_through_entry_point(installed_example_package):
    assert "race_to_21" in registered_games()
    api_test(make_env("race_to_21"), num_cycles=100)
    seed_test(lambda: make_env("race_to_21"), num_cycles=100)
    env = make_env("race_to_21(target=4)")
    env.reset(seed=0)
    for move in ("3", "1"):
        env.step(env.answer(move))
    assert env.end_reason == "game_over"
    assert env.episode_returns == {"player_0": -1.0, "player_1": 1.0}


def test_a_broken_plugin_is_a_warning_naming_it_and_the_rest_of_the_registry_works(tmp_path, monkeypatch, capsys):
    dist = tmp_path / "broken_games-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-games\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[selfplay.games]\nbroken = no_such_module_here:Game\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["games", "list"]) == 0
    out, err = capsys.readouterr()
    assert "tictactoe" in out and "broken" not in out
    assert err.count("warning") == 1 and "'broken'" in err and "no_such_module_here:Game" in err
    with pytest.raises(UserError, match="'broken' that a package registers.*cannot be loaded"):
        make_game("broken")
    make_game("tictactoe")
