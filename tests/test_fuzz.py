"""Model output is untrusted input: no string, however odd, crashes a game."""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from selfplay.games import InvalidMovePolicy, make_env
from selfplay.games.registry import builtin_games
from tests.test_conformance import OPENSPIEL_GAMES, PETTINGZOO_GAMES

boxed = st.text(max_size=30).map(lambda t: f"\\boxed{{{t}}}")
boxed_numbers = st.integers(-3, 60).map(lambda n: f"\\boxed{{{n}}}")
boxed_words = st.sampled_from(
    [
        "bet",
        "call",
        "check",
        "fold",
        "raise",
        "liar",
        "accept",
        "pass",
        "2x5",
        "pile 1 take 1",
        "offer 1 wood for 1 gold",
    ]
).map(lambda w: f"\\boxed{{{w}}}")
outputs = st.lists(st.one_of(st.text(max_size=80), boxed, boxed_numbers, boxed_words), min_size=1, max_size=40)

ENVS = {}


def env_for(spec):
    # Built once per spec: hypothesis runs many examples and each reset starts afresh.
    if spec not in ENVS:
        ENVS[spec] = make_env(spec, invalid_moves=InvalidMovePolicy(retries=3))
    return ENVS[spec]


@pytest.mark.parametrize("spec", builtin_games() + OPENSPIEL_GAMES[:2] + PETTINGZOO_GAMES[:1])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=outputs, seed=st.integers(0, 2**31 - 1))
def test_arbitrary_output_never_raises(spec, texts, seed):
    env = env_for(spec)
    env.reset(seed=seed)
    for text in texts:
        if env.end_reason is not None:
            break
        mover, turns, invalid = env.agent_selection, env.turns, len(env.invalid_log[env.agent_selection])
        env.step(text)
        # Each output is either exactly one valid move or exactly one recorded invalid move (which
        # a game that scores unreadable output itself also plays, as its unreadable move).
        outcome = (env.turns - turns, len(env.invalid_log[mover]) - invalid)
        assert outcome in ((1, 0), (1, 1) if env.game.unreadable_move() is not None else (0, 1))
        if outcome == (0, 1) and len(text) <= 200:
            assert env.invalid_log[mover][-1]["output"] == text
        assert env.observation_space(env.agent_selection).contains(env.observe(env.agent_selection))
    assert all(math.isfinite(r) for r in env.episode_returns.values())
