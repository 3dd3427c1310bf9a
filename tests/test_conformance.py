"""Every native game and the adapters pass PettingZoo's own conformance tests."""

import random

import pytest
from pettingzoo.test import api_test, seed_test

from selfplay.games import make_env
from selfplay.games.registry import NATIVE_GAMES

NATIVE_VARIANTS = [
    "liars_dice(numdice=2)",
    "liars_dice(dice_sides=4, bidding_rule=reset-quantity)",
    "nim(pile_sizes=[2, 3], misere=false)",
    "negotiation(rounds=2)",
]
OPENSPIEL_GAMES = [
    "openspiel:leduc_poker",
    "openspiel:liars_dice",
    "openspiel:connect_four(rows=5, columns=6)",
    "openspiel:pig(winscore=20)",
    "openspiel:nim(pile_sizes=1;3;5)",
    "openspiel:breakthrough(rows=5, columns=5)",
]
PETTINGZOO_GAMES = [
    "pettingzoo:pettingzoo.classic.connect_four_v3",
    "pettingzoo:pettingzoo.classic.tictactoe_v3",
]
ALL_GAMES = list(NATIVE_GAMES) + NATIVE_VARIANTS + OPENSPIEL_GAMES + PETTINGZOO_GAMES


@pytest.mark.parametrize("spec", ALL_GAMES)
def test_api_test(spec):
    api_test(make_env(spec), num_cycles=200)


@pytest.mark.parametrize("spec", ALL_GAMES)
def test_seed_test(spec):
    seed_test(lambda: make_env(spec), num_cycles=200)


@pytest.mark.parametrize("spec", ALL_GAMES)
def test_random_legal_play_finishes_without_invalid_moves(spec):
    """Games played by legal moves end normally, zero-sum where the game is, and reproducibly."""
    env = make_env(spec, max_turns=200)

    def play(seed):
        env.reset(seed=seed)
        moves = []
        rng = random.Random(seed)
        while env.end_reason is None:
            legal = env.legal_moves()
            assert len(set(legal)) == len(legal), legal
            move = rng.choice(legal)
            assert env.parse(env.answer(move)) == move
            moves.append(move)
            env.step(env.answer(move))
        return moves, dict(env.episode_returns), env.end_reason

    for seed in range(30):
        moves, returns, end_reason = play(seed)
        assert end_reason in ("game_over", "turn_cap")
        assert all(not log for log in env.invalid_log.values())
        assert abs(sum(returns.values())) < 1e-9 or not env.game.zero_sum, returns
        assert play(seed) == (moves, returns, end_reason)
