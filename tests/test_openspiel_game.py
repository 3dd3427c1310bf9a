"""The OpenSpiel adapter's simultaneous-move games (OpenSpiel's own turn-based conversion, hiding
a round's earlier choices), the agents and exact figures on them, and its one-line refusals of
parameters and games it cannot play."""

from __future__ import annotations

import os
import random

import pyspiel
import pytest
from pettingzoo.test import api_test

from selfplay.agents import IncompatibleAgentError, make_agent
from selfplay.agents.nash import NashAgent
from selfplay.cli import main
from selfplay.errors import UserError
from selfplay.evaluation import exact_play
from selfplay.evaluation.exploitability import exploitability_of, information_states
from selfplay.games import make_env, make_game
from selfplay.games.openspiel_game import native_errors_held
from selfplay.games.registry import NATIVE_GAMES

GOOFSPIEL = "openspiel:goofspiel(num_cards=4)"
SIMULTANEOUS = [GOOFSPIEL, "openspiel:goofspiel(num_cards=4, imp_info=true)", "openspiel:matrix_rps"]


def _seen_by(env, agent: str) -> tuple:
    observation = env.observe(agent)
    return observation["state"], observation["view"], observation["observation"].tobytes()


@pytest.mark.parametrize("spec", SIMULTANEOUS)
def test_the_second_mover_sees_nothing_of_the_first_movers_choice_that_round(spec):
    """Where player_1 chooses after player_0 in a round, everything player_1 is shown (prompt
    text, view, tensor) is the same whichever move player_0 chose."""
    env = make_env(spec)
    game = env.game
    checked = 0
    for seed in range(10):
        env.reset(seed=seed)
        rng = random.Random(seed)
        while env.end_reason is None:
            if env.agent_selection == "player_1":
                real, history = game.state, game.state.history()
                first_mover = game.spiel_game.new_initial_state()
                for action in history[:-1]:
                    first_mover.apply_action(action)
                seen = _seen_by(env, "player_1")
                for choice in first_mover.legal_actions():
                    game.state = first_mover.child(choice)
                    assert _seen_by(env, "player_1") == seen
                    checked += 1
                game.state = real
            env.step(env.answer(rng.choice(env.legal_moves())))
    assert checked >= 30


@pytest.mark.parametrize("spec", SIMULTANEOUS)
def test_after_a_round_each_player_sees_both_moves_as_the_game_itself_shows_them(spec):
    """Once a round is complete, each player's view is what the simultaneous game itself shows
    that player after both moves, and each move counts."""
    game = make_game(spec)
    simultaneous = game.simultaneous_game.new_initial_state()
    game.reset_to([])
    while simultaneous.is_chance_node():  # the same deal in both
        simultaneous.apply_action(game.state.history()[len(simultaneous.history())])
    first_round = None
    for round_ in range(2):
        if simultaneous.is_terminal():
            break
        moves = []
        for pick in (-1 - round_, round_):  # player_0 bids high, player_1 low
            moves.append(game.legal_actions()[pick])
            game.apply(game.move_name(moves[-1]))
        simultaneous.apply_actions(moves)
        while simultaneous.is_chance_node():
            simultaneous.apply_action(game.state.history()[len(simultaneous.history())])
        for player in (0, 1):
            assert game.describe(player).endswith(simultaneous.information_state_string(player))
        first_round = first_round or game.describe(1)
    if "matrix" in spec:
        assert "History string: 2, 0" in first_round and game.returns() == [-1.0, 1.0]  # scissors, rock
    elif "imp_info" not in spec:
        assert "P0 hand: 1 2 3 \nP1 hand: 2 3 4 " in first_round  # player_0 bid 4, player_1 bid 1


@pytest.mark.parametrize("spec", SIMULTANEOUS + ["openspiel:blotto", "openspiel:matching_pennies_3p"])
def test_simultaneous_games_pass_pettingzoos_api_test(spec):
    api_test(make_env(spec), num_cycles=50)


def test_the_rules_say_moves_are_simultaneous_and_list_a_matrix_games_payoffs():
    goofspiel, rps = make_game(GOOFSPIEL), make_game("openspiel:matrix_pd")
    for game in (goofspiel, rps):
        assert "its moves are simultaneous" in game.rules and "turn_based" not in game.rules
    assert "OpenSpiel game 'goofspiel(num_cards=4)'" in goofspiel.rules and "Score more points" in goofspiel.rules
    assert "Cooperate against Defect: 0 and 10; Defect against Cooperate: 10 and 0" in rps.rules
    assert "player 0 moving first" in make_game("openspiel:tic_tac_toe").rules
    # OpenSpiel calls goofspiel perfect-information: every bid is shown, once the round's are all made.
    assert "2 players with perfect information of past rounds, its moves are simultaneous" in goofspiel.rules
    assert "with perfect information, player 0 moving first" in make_game("openspiel:tic_tac_toe").rules


def test_mcts_refuses_a_simultaneous_game_in_one_line_and_nash_solves_one(capfd):
    rps = make_game("openspiel:matrix_rps")
    with pytest.raises(IncompatibleAgentError, match="'matrix_rps\\(\\)' has simultaneous moves; agents that play it"):
        make_agent("mcts", rps, seed=0)
    with pytest.raises(IncompatibleAgentError, match="resample"):
        make_agent("mcts", make_game("openspiel:liars_dice"), seed=0)
    assert capfd.readouterr().err == ""  # OpenSpiel's "not implemented" line is held back
    nash = make_agent("nash", rps, seed=0)
    assert isinstance(nash, NashAgent) and nash.exploitability < 0.01


def test_exploitability_applies_to_a_converted_game_and_exact_play_refuses_one():
    """Rock, paper, scissors' uniform policy is its equilibrium; always playing rock is exploited by 1."""
    states = information_states("openspiel:matrix_rps")
    assert [state.player for state in states] == [0, 1]
    uniform = {state.key: {action: 1 / 3 for action in state.actions} for state in states}
    rock = {state.key: {0: 1.0, 1: 0.0, 2: 0.0} for state in states}
    assert exploitability_of("openspiel:matrix_rps", uniform) == pytest.approx(0.0)
    assert exploitability_of("openspiel:matrix_rps", rock) == pytest.approx(1.0)
    with pytest.raises(UserError, match="hides information"):
        exact_play.perfect_information_twin("openspiel:matrix_rps")


# -- refusals ---------------------------------------------------------------------------------


class CardGame:
    """A registered game's factory that states its parameter's type."""

    def __init__(self, cards: int = 4):
        self.cards = cards


class UntypedCardGame:
    """A registered game's factory that states no types: a wrong value fails inside it."""

    def __init__(self, cards=4):
        self.hand = list(range(cards))


@pytest.fixture
def registered_card_games(monkeypatch):
    monkeypatch.setitem(NATIVE_GAMES, "cards", f"{__name__}:CardGame")
    monkeypatch.setitem(NATIVE_GAMES, "untyped_cards", f"{__name__}:UntypedCardGame")


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            "openspiel:goofspiel(num_cards=x)",
            "OpenSpiel game 'goofspiel': parameter 'num_cards' takes a whole number, not 'x' (its default: "
            "num_cards=13).",
        ),
        (
            "openspiel:goofspiel(imp_info=1)",
            "parameter 'imp_info' takes true or false, not 1 (its default: imp_info=false)",
        ),
        (
            "openspiel:goofspiel(cards=4)",
            "OpenSpiel game 'goofspiel' has no parameter 'cards'; its parameters: egocentric",
        ),
        ("liars_dice(numdice=2.5)", "OpenSpiel game 'liars_dice': parameter 'numdice' takes a whole number, not 2.5"),
        (
            "nim(pile_sizes=x)",
            "OpenSpiel cannot load 'nim' with {'is_misere': True, 'pile_sizes': 'x'}: Could not parse",
        ),
        (
            "nim(pile_sizes=[1, 'x'])",
            "Game 'nim': parameter 'pile_sizes' takes text or a list (a whole number each) or",
        ),
        ("nim(foo=1)", "Game 'nim' has no parameter 'foo'; its parameters: pile_sizes, misere."),
        (
            "negotiation(rounds=x)",
            "Game 'negotiation': parameter 'rounds' takes a whole number, not 'x' (its default: rounds=5).",
        ),
        ("arithmetic(format_penalty=x)", "Game 'arithmetic': parameter 'format_penalty' takes a number, not 'x'"),
        ("cards(cards=x)", "Game 'cards': parameter 'cards' takes a whole number, not 'x' (its default: cards=4)."),
        ("untyped_cards(cards=x)", "Game 'untyped_cards' cannot use the values {'cards': 'x'}: 'str' object cannot be"),
        ("openspiel:checkers(rows=6, columns=6)", "is over before anyone moves (its first state is terminal)"),
        ("openspiel:goofspiel(num_cards=0)", "OpenSpiel's 'goofspiel(num_cards=0)' deals nothing at these parameters"),
        ("openspiel:nfg_game", "OpenSpiel cannot load 'nfg_game' with {}"),
    ],
)
def test_a_parameter_or_game_that_cannot_be_played_is_one_message_and_nothing_else(
    spec, message, registered_card_games, capfd
):
    with pytest.raises(UserError) as err:
        make_env(spec)
    assert message in str(err.value)
    assert capfd.readouterr() == ("", "")  # nothing from OpenSpiel's C++ code


def test_the_cli_prints_one_line_for_a_wrong_typed_openspiel_parameter(capfd):
    assert main(["play", "openspiel:goofspiel(num_cards=x)", "--agents", "random,random", "--no-progress"]) == 2
    out, err = capfd.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("selfplay: error: OpenSpiel game 'goofspiel'")


def test_values_that_fit_are_taken_a_whole_number_as_a_real_valued_openspiel_parameter():
    assert make_game("openspiel:go(board_size=5, komi=7)").spiel_game.get_parameters()["komi"] == 7.0
    assert make_game("nim(pile_sizes=[1, 2], misere=false)").spiel_game.get_parameters()["pile_sizes"] == "1;2"


def test_native_stderr_is_written_out_after_a_block_that_succeeds_and_dropped_after_one_that_raises(capfd):
    with native_errors_held():
        os.write(2, b"kept\n")
    with pytest.raises(pyspiel.SpielError), native_errors_held():
        os.write(2, b"dropped\n")
        pyspiel.load_game("goofspiel", {"num_cards": "x"})
    assert capfd.readouterr().err == "kept\n"
