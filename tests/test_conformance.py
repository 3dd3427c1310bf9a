"""Every built-in game and the adapters pass PettingZoo's own conformance tests."""

import random

import pytest
from pettingzoo.test import api_test, seed_test

from selfplay.games import InvalidMovePolicy, make_env
from selfplay.games.registry import builtin_games

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
    "pettingzoo:pettingzoo.classic.rps_v2(max_cycles=3)",
    "pettingzoo:pettingzoo.classic.rps_v2.parallel_env(max_cycles=3)",
]
ALL_GAMES = builtin_games() + NATIVE_VARIANTS + OPENSPIEL_GAMES + PETTINGZOO_GAMES


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


HANABI = "openspiel:hanabi(players=2, colors=1, ranks=2, hand_size=2, max_information_tokens=3, max_life_tokens=1)"
INVALID_TEXTS = ["I pass my turn.", "\\boxed{no such move}", "\\boxed{}"]


@pytest.mark.parametrize("spec", ALL_GAMES + ["openspiel:kuhn_poker(players=3)", HANABI])
def test_whole_games_through_the_text_protocol_with_legal_and_invalid_texts(spec):
    """Whole games played as a model writes moves: reasoning then a boxed legal move, and now and
    then an invalid text first, which a retry absorbs without changing the game."""
    env = make_env(spec, invalid_moves=InvalidMovePolicy(retries=1))
    rng = random.Random(0)
    for seed in range(5):
        env.reset(seed=seed)
        invalid = 0
        while env.end_reason is None:
            agent, legal = env.agent_selection, list(env.legal_moves())
            observation = env.observe(agent)
            assert env.observation_space(agent).contains(observation)
            if rng.random() < 0.2 and env.game.unreadable_move() is None:  # else the game scores it and goes on
                env.step(rng.choice(INVALID_TEXTS))
                invalid += 1
                assert env.agent_selection == agent and env.legal_moves() == legal and env.end_reason is None
                assert "Your previous answer was invalid" in env.observe(agent)["state"]
            env.step(f"Let me think about the position. {env.answer(rng.choice(legal))}")
        assert sum(map(len, env.invalid_log.values())) == invalid
        assert env.end_reason in ("game_over", "turn_cap")
