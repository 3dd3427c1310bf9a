"""Simple Negotiation: PettingZoo API, rules, scoring, parsing and privacy."""

from __future__ import annotations

import re

import numpy as np
import pytest

from selfplay.errors import UserError
from selfplay.games import make_env, make_game
from selfplay.games.negotiation import SimpleNegotiation


def _fresh(inventory: list[list[int]], values: list[list[int]]) -> SimpleNegotiation:
    game = SimpleNegotiation()
    game.reset(np.random.default_rng(0))
    game.inventory = [row[:] for row in inventory]
    game.values = [row[:] for row in values]
    return game


def _play_randomly(env, rng: np.random.Generator, accept_rate: float = 0.5) -> None:
    """A full game: accept a pending offer with `accept_rate`, otherwise a uniform legal move."""
    env.reset(seed=int(rng.integers(2**31)))
    for _agent in env.agent_iter():
        _, _, terminated, truncated, _ = env.last(observe=False)
        if terminated or truncated:
            env.step(None)
            continue
        moves = env.legal_moves()
        move = "accept" if "accept" in moves and rng.random() < accept_rate else moves[rng.integers(len(moves))]
        env.step(env.answer(move))


def test_constructible_with_no_arguments_and_with_parameters():
    game = make_game("negotiation")
    assert isinstance(game, SimpleNegotiation) and game.turns == 10
    assert SimpleNegotiation.__doc__.splitlines()[0].startswith("Simple Negotiation")
    small = make_game("negotiation(rounds=2, min_quantity=1, max_quantity=2, min_value=5, max_value=5)")
    small.reset(np.random.default_rng(1))
    assert small.turns == 4
    assert all(1 <= q <= 2 for row in small.inventory for q in row)
    assert small.values == [[5, 5, 5], [5, 5, 5]]
    with pytest.raises(UserError):
        SimpleNegotiation(rounds=0)
    with pytest.raises(UserError):
        SimpleNegotiation(min_value=4, max_value=3)


def test_random_games_finish_validly_and_zero_sum():
    env = make_env("negotiation")
    rng = np.random.default_rng(7)
    trades = 0
    for _ in range(40):
        _play_randomly(env, rng)
        game = env.game
        assert env.end_reason == "game_over" and env.turns == game.turns == 10
        assert all(not log for log in env.invalid_log.values())
        returns = [env.episode_returns[a] for a in env.possible_agents]
        assert sum(returns) == 0 and set(returns) <= {-1.0, 0.0, 1.0}
        gains = game.gains()
        assert returns == [float(np.sign(gains[0] - gains[1])), float(np.sign(gains[1] - gains[0]))]
        # Trades move goods between the players: the totals stay, nobody goes below zero.
        assert all(game.net[0][r] == -game.net[1][r] for r in range(3))
        assert min(min(row) for row in game.inventory) >= 0
        trades += sum("accepted" in event for event in game.history)
    assert trades > 0


def test_hand_checked_trade():
    env = make_env("negotiation")
    env.reset(seed=0)
    game = env.game
    game.inventory = [[4, 2, 1], [1, 3, 5]]
    game.values = [[1, 5, 2], [6, 2, 3]]
    env.step(env.answer("offer 3 wood for 2 stone"))
    assert game.pending is not None and "accept" in env.legal_moves()
    np.testing.assert_array_equal(game.observation_tensor(1), [1, 3, 5, 6, 2, 3, 4, 2, 1, 3, -2, 0, 1, 9])
    np.testing.assert_array_equal(game.observation_tensor(0)[9:], [-3, 2, 0, -1, 9])
    env.step(env.answer("accept"))
    assert game.inventory == [[1, 4, 1], [4, 1, 5]]
    # player_0: -3 wood * 1 + 2 stone * 5 = +7; player_1: +3 wood * 6 - 2 stone * 2 = +14.
    assert game.gains() == [7, 14]
    assert "player_1 accepted: player_0 gave 3 wood and received 2 stone." in game.history
    while env.agents and not env.terminations[env.agent_selection]:
        env.step(env.answer("pass"))
    assert env.end_reason == "game_over" and env.turns == 10
    assert env.episode_returns == {"player_0": -1.0, "player_1": 1.0}
    assert game.returns() == [-1.0, 1.0]


def test_equal_gains_draw_and_larger_gain_wins():
    game = _fresh([[5, 5, 5], [5, 5, 5]], [[2, 1, 1], [1, 2, 1]])
    game.apply("offer 1 stone for 1 wood")
    game.apply("accept")
    for _ in range(8):
        game.apply("pass")
    assert game.is_over() and game.gains() == [1, 1] and game.returns() == [0.0, 0.0]

    game = _fresh([[5, 5, 5], [5, 5, 5]], [[9, 1, 1], [9, 1, 1]])
    game.apply("pass")
    game.apply("offer 2 gold for 1 wood")
    game.apply("accept")
    for _ in range(7):
        game.apply("pass")
    assert game.gains() == [-7, 7] and game.returns() == [-1.0, 1.0]


def test_parse_is_lenient_about_form():
    game = _fresh([[5, 5, 5], [5, 5, 5]], [[1, 1, 1], [1, 1, 1]])
    offers = ("Offer 2 wood for 1 gold", "offer 2 Wood -> 1 Gold", "[offer 2 woods for 1 gold.]", "2 wood => 1 gold")
    for answer in offers:
        assert game.parse_move(answer) == "offer 2 wood for 1 gold", answer
    for answer in ("pass", "Decline", "reject", "[pass]", "decline the offer"):
        assert game.parse_move(answer) == "pass", answer
    game.apply("offer 2 wood for 1 gold")
    assert "Your offer of 2 wood for 1 gold is pending." in game.describe(0)
    for answer in ("accept", "[accept]", "Accept", "accept the offer"):
        assert game.parse_move(answer) == "accept", answer
    env = make_env("negotiation")
    env.reset(seed=1)
    env.step("Let me try this. \\boxed{\\text{Offer 1 Stone for 1 Gold}}")
    assert not env.invalid_log["player_0"] and env.game.history == ["player_0 offered 1 stone for 1 gold."]


def test_illegal_moves_are_rejected():
    game = _fresh([[5, 12, 0], [3, 5, 5]], [[1, 1, 1], [1, 1, 1]])
    illegal = [
        "accept",  # nothing is pending
        "offer 6 wood for 1 gold",  # holds 5 wood
        "offer 1 gold for 1 wood",  # holds no gold
        "offer 1 wood for 4 wood",  # the same resource
        "offer 1 wood for 6 stone",  # the opponent holds 5 stone
        "offer 0 wood for 1 gold",
        "offer 11 stone for 1 gold",  # more than 10 units
        "offer 2 silver for 1 gold",
        "offer 2 wood for 1 gold and 1 stone",
        "give me everything",
        "",
    ]
    for answer in illegal:
        assert game.parse_move(answer) is None, answer
    moves = game.legal_moves()
    assert "accept" not in moves and "offer 10 stone for 5 gold" in moves and "offer 11 stone for 1 gold" not in moves
    # Wood: 1-5 units for 1-5 stone or gold; stone (capped at 10): 1-10 for 1-3 wood or 1-5 gold.
    assert len(moves) == len(set(moves)) == 5 * (5 + 5) + 10 * (3 + 5) + 1
    game.apply("offer 1 wood for 1 stone")
    game.apply("offer 1 gold for 2 wood")  # a counter-offer replaces the pending one
    assert game.pending.player == 1 and game.parse_move("accept") == "accept"
    game.apply("pass")
    assert game.pending is None and game.parse_move("accept") is None


def test_a_player_never_sees_the_opponents_values():
    env = make_env("negotiation")
    rng = np.random.default_rng(3)
    env.reset(seed=3)
    for _ in range(6):
        moves = env.legal_moves()
        env.step(env.answer(moves[rng.integers(len(moves))]))
    game = env.game
    for player in (0, 1):
        agent = env.possible_agents[player]
        text, tensor = env.state_text(agent), game.observation_tensor(player)
        saved = [row[:] for row in game.values]
        game.values[1 - player] = [v + 97 for v in game.values[1 - player]]
        assert env.state_text(agent) == text
        np.testing.assert_array_equal(game.observation_tensor(player), tensor)
        game.values = saved

    game = _fresh([[3, 4, 5], [4, 5, 3]], [[1, 2, 1], [7, 8, 9]])
    assert "wood 1, stone 2, gold 1" in game.describe(0)
    assert not re.search("[789]", game.describe(0))
    assert "wood 7, stone 8, gold 9" in game.describe(1)


def test_moves_prompt_describes_the_forms_compactly():
    game = _fresh([[5, 5, 5], [5, 5, 5]], [[1, 1, 1], [1, 1, 1]])
    assert len(game.legal_moves()) > 100
    prompt = game.moves_prompt()
    assert "offer Q1 R1 for Q2 R2" in prompt and "'pass'" in prompt and "accept" not in prompt
    assert len(prompt) < 400
    game.apply("offer 1 wood for 1 gold")
    assert "'accept'" in game.moves_prompt()
