"""Held-out games a model can play: readable text, rules with objective, side and notation."""

from __future__ import annotations

import random

import pyspiel
import pytest

from selfplay.games import make_env
from selfplay.games.base import _printable

# OpenSpiel games whose strings hold box drawing, card symbols, suits, arrows or colour codes.
SYMBOL_GAMES = ["dots_and_boxes", "bridge", "skat", "solitaire", "twixt"]


def test_box_drawing_cards_and_suits_become_ascii_without_losing_anything():
    assert _printable("┌───┬╴ ╶┐\n├╴ ╶┼╴ ╶┤") == "+---+- -+\n+- -+- -+"
    assert _printable("♠ AK ♥ Q 🂡 🃞 🂠 ← é \x1b[31mx\x1b[0m ☃") == "S AK H Q AS KC [back] <- e x [snowman]"


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
            ascii_text = _printable(text)
            assert ascii_text.isascii() and ascii_text.count("?") == text.count("?"), text
        state.apply_action(rng.choice(state.legal_actions()))


def test_dots_and_boxes_prompt_draws_the_grid_in_ascii():
    env = make_env("openspiel:dots_and_boxes")
    env.reset(seed=0)
    env.step(env.answer(env.legal_moves()[0]))
    state = env.observe(env.agent_selection)["state"]
    assert "+---+" in state and "?" not in state
