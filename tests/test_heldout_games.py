"""Held-out games a model can play: readable text, rules with objective, side and notation."""

from __future__ import annotations

import random

import pyspiel
import pytest

from selfplay.games import TextGame, make_env
from selfplay.games.base import ascii_text
from selfplay.games.openspiel_rules import CATALOGUE
from selfplay.games.registry import registered_games
from selfplay.prompts import opening_messages

# OpenSpiel games whose strings hold box drawing, card symbols, suits, arrows or colour codes.
SYMBOL_GAMES = ["dots_and_boxes", "bridge", "skat", "solitaire", "twixt"]


def test_box_drawing_cards_and_suits_become_ascii_without_losing_anything():
    assert ascii_text("┌───┬╴ ╶┐\n├╴ ╶┼╴ ╶┤") == "+---+- -+\n+- -+- -+"
    assert ascii_text("♠ AK ♥ Q 🂡 🃞 🂠 ← é \x1b[31mx\x1b[0m ☃") == "S AK H Q AS KC [back] <- e x [snowman]"


@pytest.mark.parametrize("name", SYMBOL_GAMES)
def test_every_string_of_a_game_with_symbols_renders_in_ascii(name):
    game, rng = pyspiel.load_game(name), random.Random(0)
    kind = game.get_type()
    state = game.new_initial_state()
    for _ in range(40):
        if state.is_terminal():
            break
        if state.is_chance_node():
            state.apply_action(rng.choice([a for a, _ in state.chance_outcomes()]))
            continue
        player = state.current_player()
        texts = [str(state), *(state.action_to_string(player, a) for a in state.legal_actions())]
        if kind.provides_observation_string:
            texts.append(state.observation_string(player))
        if kind.provides_information_state_string:
            texts.append(state.information_state_string(player))
        for text in texts:
            shown = ascii_text(text)
            assert shown.isascii() and shown.count("?") == text.count("?"), text
        state.apply_action(rng.choice(state.legal_actions()))


def test_dots_and_boxes_prompt_draws_the_grid_in_ascii():
    env = make_env("openspiel:dots_and_boxes")
    env.reset(seed=0)
    env.step(env.answer(env.legal_moves()[0]))
    state = env.observe(env.agent_selection)["state"]
    assert "+---+" in state and "?" not in state


PLAYED_DYNAMICS = (pyspiel.GameType.Dynamics.SEQUENTIAL, pyspiel.GameType.Dynamics.SIMULTANEOUS)


def _adaptable_openspiel_games() -> list[str]:
    """Every OpenSpiel game the adapter plays with its default parameters, turn-based or with
    simultaneous moves (played through OpenSpiel's turn-based conversion). The games written in
    Python (`python_*`) are left out: they exist only once `open_spiel.python.games` is imported,
    which other tests may or may not have done."""
    specs = []
    for name in pyspiel.registered_names():
        if name.startswith("python_"):
            continue
        try:
            game = pyspiel.load_game(name)
            if game.num_players() < 2 or game.get_type().dynamics not in PLAYED_DYNAMICS:
                continue
            game.new_initial_state().legal_actions()
        except (pyspiel.SpielError, IndexError):  # it needs parameters, or is played through action structs
            continue
        specs.append(f"openspiel:{name}")
    return specs


PLAYABLE = [
    *registered_games(),
    *_adaptable_openspiel_games(),
    "openspiel:kuhn_poker(players=3)",
    "openspiel:leduc_poker(players=3)",
    "pettingzoo:pettingzoo.classic.connect_four_v3",
    "pettingzoo:pettingzoo.classic.tictactoe_v3",
    "pettingzoo:pettingzoo.classic.go_v5(board_size=5)",
]
OBJECTIVE_WORDS = ("objective", "win", "score")


def test_the_rules_catalogue_covers_the_games_used_to_evaluate_language_models():
    assert len(CATALOGUE) >= 15
    for name, rules in CATALOGUE.items():
        game = pyspiel.load_game(name)  # every entry names a real game, with a side for each seat or none
        assert len(rules.sides) in (0, game.num_players()), name


@pytest.mark.parametrize("spec", PLAYABLE)
def test_first_prompts_name_the_objective_the_players_side_and_the_legal_moves(spec):
    env = make_env(spec)
    env.reset(seed=0)
    for _ in range(2):  # the first two prompts: each of two players' first, or one player's two
        if env.end_reason is not None:
            break
        agent = env.agent_selection
        system, user = (m["content"] for m in opening_messages(env.observe(agent), "full"))
        assert any(word in system.lower() for word in OBJECTIVE_WORDS), system
        assert user.startswith(f"You are {agent}."), user
        if spec.startswith("openspiel:"):
            seat = env.possible_agents.index(agent)
            assert "Objective: " in system and "How a move is written: " in system
            assert f"You are player {seat} of {len(env.possible_agents)}" in user
        if type(env.game).moves_prompt is TextGame.moves_prompt:  # else the game writes its own summary
            assert all(move in user for move in env.legal_moves())
        env.step(env.answer(env.legal_moves()[0]))
