"""The advantage estimators against hand-computed numbers: RAE's baselines, MARS's returns-to-go, the group
and per-key baselines, and the dispatcher the trainer calls."""

from __future__ import annotations

import random
from types import MappingProxyType

import pytest

from selfplay.advantages import (
    ESTIMATORS,
    advantage_stats,
    estimate,
    grpo,
    rae,
    reinforce,
    rloo,
    trr_plus_plus,
    turn_level_returns,
)
from selfplay.errors import UserError
from selfplay.records import MatchResult, Trajectory, Turn
from selfplay.roles.base import game_and_role

P0, P1 = ("ttt", "player_0"), ("ttt", "player_1")
ROOT_1_5 = 1.224744871  # sqrt(1.5): the whitened extremes of three evenly spaced values


def turn(
    seat: int,
    reward: float = 0.0,
    *,
    game: str = "ttt",
    role: str | None = None,
    invalid: bool = False,
    prompt: tuple[int, ...] = (1,),
    retried_penalty: float | None = None,
) -> Turn:
    return Turn(
        game=game,
        match_seed=0,
        seat=seat,
        role=role or f"player_{seat}",
        agent="policy",
        policy_version=0,
        prompt_ids=prompt,
        response_ids=(2,),
        logprobs=(-0.5,),
        text="\\boxed{0}",
        finish_reason="stop",
        invalid=invalid or retried_penalty is not None,
        reward=reward,
        retried_penalty=retried_penalty,
    )


def traj(rewards: tuple[float, ...], turns: list[Turn], *, game: str = "ttt", seed: int = 0) -> Trajectory:
    result = MatchResult(
        game=game,
        seed=seed,
        players=("policy",) * len(rewards),
        rewards=rewards,
        invalid_moves=(0,) * len(rewards),
        turns=len(turns),
        end_reason="game_over",
    )
    return Trajectory(result, tuple(turns))


def alternating(rewards: tuple[float, ...], n: int = 3, *, game: str = "ttt", seed: int = 0) -> Trajectory:
    """A two-seat game of `n` turns starting with seat 0."""
    return traj(rewards, [turn(i % 2, game=game) for i in range(n)], game=game, seed=seed)


def close(values):
    # Whitening divides by std + 1e-6, which moves results by about 1e-6 relative.
    return pytest.approx(values, abs=1e-5)


def assert_close(actual, expected):
    """Advantages match `expected` in shape (turns per trajectory) and, within rounding, in value."""
    assert [len(row) for row in actual] == [len(row) for row in expected]
    assert [a for row in actual for a in row] == close([e for row in expected for e in row])


# ---- RAE ----


def test_rae_compares_a_batch_with_the_baselines_of_its_start_then_moves_them_towards_its_mean():
    batch = [alternating((1.0, -1.0)), alternating((1.0, -1.0)), alternating((-1.0, 1.0))]
    advantages, baselines = rae(batch, {})
    # Every game meets b = 0. Then b0 moves as three EMA steps towards the mean return 1/3:
    # 0.95**3 * 0 + (1 - 0.95**3) / 3 = 0.142625 / 3; b1 mirrors it.
    assert_close(advantages, [(1.0, -1.0, 1.0), (1.0, -1.0, 1.0), (-1.0, 1.0, -1.0)])
    assert baselines == close({P0: 0.142625 / 3, P1: -0.142625 / 3})


def test_rae_reads_the_baseline_before_updating_and_leaves_the_input_alone():
    start = {P0: 0.5}
    advantages, baselines = rae([traj((1.0, -1.0), [turn(0)])], MappingProxyType(start))
    assert_close(advantages, [(0.5,)])  # 1 - 0.5, not 1 - (0.95*0.5 + 0.05*1)
    assert baselines == close({P0: 0.525})
    assert start == {P0: 0.5}


def test_rae_keeps_one_baseline_per_game_and_role():
    batch = [alternating((1.0, -1.0), 2), alternating((1.0, -1.0), 2, game="kuhn")]
    advantages, baselines = rae(batch, {}, decay=0.9)
    assert_close(advantages, [(1.0, -1.0), (1.0, -1.0)])  # kuhn does not see ttt's baselines
    assert baselines == close({P0: 0.1, P1: -0.1, ("kuhn", "player_0"): 0.1, ("kuhn", "player_1"): -0.1})


def test_rae_leaves_seats_without_turns_untouched():
    # Seat 1 was a random opponent: its turns were stripped, so its baseline must not move.
    advantages, baselines = rae([traj((1.0, -1.0), [turn(0), turn(0)])], {P1: 0.3})
    assert_close(advantages, [(1.0, 1.0)])
    assert baselines == close({P0: 0.05, P1: 0.3})


def test_rae_with_a_custom_key_shares_a_baseline_between_seats():
    # Both seats meet b = 0.2; it then moves two steps towards their mean return, 0: 0.95**2 * 0.2.
    advantages, baselines = rae([alternating((1.0, -1.0), 2)], {"ttt": 0.2}, key=lambda t: t.game)
    assert_close(advantages, [(0.8, -1.2)])
    assert baselines == close({"ttt": 0.1805})


STATE_BATCH = [
    traj((2.0, -2.0), [turn(0, prompt=(7,))]),
    traj((0.0, 0.0), [turn(0, prompt=(7,))]),
    traj((1.0, -1.0), [turn(0, prompt=(8,))]),
]


def test_rae_state_prior_baselines_each_turn_on_the_other_plays_of_its_prompt():
    # Role baseline b = 0.5 at the batch's start. Prompt 7 was played twice (returns 2 and 0),
    # prompt 8 once. With one pseudo-play at b:
    #   first:  (0 others' sum + 1 * 0.5) / (1 + 1) = 0.25   -> A = 2 - 0.25 = 1.75
    #   second: (2 + 1 * 0.5) / (1 + 1) = 1.25                -> A = 0 - 1.25 = -1.25
    #   third:  no other play of prompt 8: (0 + 1 * 0.5) / 1  -> A = 1 - 0.5 = 0.5
    # b then moves (decay 0.5) three steps towards the mean return 1, as without the prior.
    advantages, baselines = rae(STATE_BATCH, {P0: 0.5}, decay=0.5, state_prior=1.0)
    assert_close(advantages, [(1.75,), (-1.25,), (0.5,)])
    assert baselines == close({P0: 0.125 * 0.5 + 0.875}) == rae(STATE_BATCH, {P0: 0.5}, decay=0.5)[1]


def test_rae_state_prior_zero_is_leave_one_out_falling_back_to_the_role_baseline_when_alone():
    advantages, _ = rae(STATE_BATCH, {P0: 0.5}, decay=0.5, state_prior=0.0)
    assert_close(advantages, [(2.0 - 0.0,), (0.0 - 2.0,), (1.0 - 0.5,)])


def test_rae_state_prior_counts_each_seat_once_per_prompt():
    # Seat 0 sees prompt 7 twice in the first game: its other play of prompt 7 is only the second game.
    batch = [traj((2.0, -2.0), [turn(0, prompt=(7,)), turn(0, prompt=(7,))]), traj((0.0, 0.0), [turn(0, prompt=(7,))])]
    advantages, _ = rae(batch, {}, state_prior=0.0)
    assert_close(advantages, [(2.0, 2.0), (-2.0,)])


def test_estimate_passes_the_state_prior_to_rae():
    assert estimate("rae", STATE_BATCH, {}, state_prior=2.0) == rae(STATE_BATCH, {}, state_prior=2.0)


# ---- MARS turn-level returns ----


def test_turn_level_gives_the_unpaid_final_reward_to_the_last_turn_and_sums_forward():
    # Seat 0's rewards 0, 0.5, 0 pay 0.5 of its return 2; the other 1.5 lands on its last turn:
    # r = [0, 0.5, 1.5], returns-to-go G = [2, 2, 1.5]; mean 11/6, std sqrt(1/18).
    batch = [traj((2.0, -2.0), [turn(0, 0.0), turn(0, 0.5), turn(0, 0.0)])]
    assert_close(turn_level_returns(batch), [(0.707106781, 0.707106781, -1.414213562)])


def test_turn_level_separates_seats_and_adds_the_valid_turn_bonus():
    # Seat 0 wins on its third move: r = [0.5, 0.5, 1.5], G = [2.5, 2, 1.5] -> [+sqrt 1.5, 0, -sqrt 1.5].
    # Seat 1's -1 arrives after seat 0's last move: r = [0.5, 0.5 - 1], G = [0, -0.5] -> [1, -1].
    moves = [turn(0), turn(1), turn(0), turn(1), turn(0, 1.0)]
    advantages = turn_level_returns([traj((1.0, -1.0), moves)], valid_turn_bonus=0.5)
    assert_close(advantages, [(ROOT_1_5, 1.0, 0.0, -1.0, -ROOT_1_5)])


def test_turn_level_gives_no_bonus_to_invalid_turns_and_normalises_across_the_batch():
    # With bonus 1: game A r = [1, -1] (the invalid move earns no bonus), G = [0, -1]; game B G = [1].
    # One (game, role) group over the batch: [0, -1, 1] -> [0, -sqrt 1.5, +sqrt 1.5].
    batch = [
        traj((-1.0, 0.5), [turn(0), turn(0, -1.0, invalid=True)], seed=1),
        traj((0.0, 0.0), [turn(0)], seed=2),
    ]
    assert_close(turn_level_returns(batch, valid_turn_bonus=1.0), [(0.0, -ROOT_1_5), (ROOT_1_5,)])


def test_turn_level_gives_zero_to_a_lone_value():
    assert turn_level_returns([traj((1.0, -1.0), [turn(0, 1.0), turn(1)])]) == [(0.0, 0.0)]


# ---- GRPO, Dr.GRPO and RLOO ----

# Three plays of ttt seed 7 (player_0 returns 1, 1, -1), one of seed 8 and one of kuhn seed 7: lone groups.
GROUPED = [
    alternating((1.0, -1.0), 2, seed=7),
    alternating((1.0, -1.0), 2, seed=7),
    alternating((-1.0, 1.0), 2, seed=7),
    alternating((1.0, -1.0), 2, seed=8),
    alternating((1.0, -1.0), 2, game="kuhn", seed=7),
]


def test_grpo_whitens_returns_within_each_game_start():
    # player_0: mean 1/3, std sqrt(8/9); deviations 2/3, 2/3, -4/3.
    assert_close(
        grpo(GROUPED),
        [
            (0.707106781, -0.707106781),
            (0.707106781, -0.707106781),
            (-1.414213562, 1.414213562),
            (0.0, 0.0),
            (0.0, 0.0),
        ],
    )


def test_dr_grpo_skips_the_std_division():
    assert_close(
        grpo(GROUPED, scale=False), [(2 / 3, -2 / 3), (2 / 3, -2 / 3), (-4 / 3, 4 / 3), (0.0, 0.0), (0.0, 0.0)]
    )


def test_rloo_subtracts_the_mean_of_the_other_members():
    # player_0: 1 - (1 - 1)/2 = 1, twice; -1 - (1 + 1)/2 = -2.
    assert_close(rloo(GROUPED), [(1.0, -1.0), (1.0, -1.0), (-2.0, 2.0), (0.0, 0.0), (0.0, 0.0)])


def test_group_estimators_skip_seats_without_turns():
    # One key for both seats; seat 1 has no turns, so only seat 0's returns 3 and 1 form the group.
    batch = [traj((3.0, 10.0), [turn(0)], seed=7), traj((1.0, 10.0), [turn(0)], seed=7)]
    by_game = {"key": lambda t: t.game}
    assert_close(grpo(batch, **by_game, scale=False), [(1.0,), (-1.0,)])
    assert_close(rloo(batch, **by_game), [(2.0,), (-2.0,)])
    assert_close(trr_plus_plus(batch, **by_game), [(1.0,), (-1.0,)])


# ---- TRR++ and REINFORCE ----


def test_trr_plus_plus_whitens_per_key_across_the_whole_batch():
    # Proposer returns 2, 0, 1 over three different tasks (seeds): mean 1, std sqrt(2/3).
    # The solver's returns 0.5, 0.5, 0.5 have no spread: 0. The lone kuhn proposer: 0.
    def task(proposer: float, seed: int, game: str = "code") -> Trajectory:
        moves = [turn(0, game=game, role="proposer"), turn(1, game=game, role="solver")]
        return traj((proposer, 0.5), moves, game=game, seed=seed)

    batch = [task(2.0, 1), task(0.0, 2), task(1.0, 3), task(5.0, 1, game="kuhn")]
    expected = [(ROOT_1_5, 0.0), (-ROOT_1_5, 0.0), (0.0, 0.0), (0.0, 0.0)]
    assert_close(trr_plus_plus(batch), expected)


def test_reinforce_uses_the_raw_return():
    assert reinforce([alternating((1.0, -1.0)), traj((0.5, 0.0), [turn(1)])]) == [(1.0, -1.0, 1.0), (0.0,)]


# ---- dispatcher and statistics ----


@pytest.mark.parametrize("name", ESTIMATORS)
def test_every_estimator_aligns_one_advantage_with_each_turn(name):
    batch = [alternating((1.0, -1.0), 3, seed=1), traj((0.0, 0.0), []), alternating((-1.0, 1.0), 4, seed=1)]
    start = {P0: 0.2}
    advantages, baselines = estimate(name, batch, start)
    assert [len(a) for a in advantages] == [3, 0, 4]
    assert all(isinstance(a, float) for row in advantages for a in row)
    assert baselines is not start and start == {P0: 0.2}
    if name != "rae":
        assert baselines == start


def mixed_batch(rng: random.Random) -> list[Trajectory]:
    """Games of two kinds and lengths, repeated starts, repeated prompts and one-sided seats."""
    batch = []
    for index in range(24):
        game = rng.choice(["ttt", "kuhn"])
        reward = rng.choice([-2.0, -1.0, 0.0, 1.0, 2.0])
        seats = [rng.randrange(2) for _ in range(rng.randint(1, 5))]
        turns = [turn(seat, game=game, prompt=(rng.randrange(3),), invalid=rng.random() < 0.2) for seat in seats]
        batch.append(traj((reward, -reward), turns, game=game, seed=index % 6))
    return batch


ORDERINGS = [(name, None) for name in ESTIMATORS] + [("rae", 0.0), ("rae", 4.0)]


@pytest.mark.parametrize(("name", "state_prior"), ORDERINGS)
def test_every_estimator_gives_each_trajectory_the_same_advantages_in_any_order_of_the_batch(name, state_prior):
    # The engine hands a step's games over in the order they finish, which depends on the moves
    # played (a fold ends a game early): no turn's advantage may depend on that order.
    rng = random.Random(7)
    batch = mixed_batch(rng)
    start = {("ttt", "player_0"): 0.3, ("kuhn", "player_1"): -0.4}
    expected, expected_baselines = estimate(name, batch, start, state_prior=state_prior, turn_discount=0.9)
    for _ in range(5):
        order = list(range(len(batch)))
        rng.shuffle(order)
        advantages, baselines = estimate(
            name, [batch[i] for i in order], start, state_prior=state_prior, turn_discount=0.9
        )
        assert_close([advantages[order.index(i)] for i in range(len(batch))], expected)
        assert baselines == close(expected_baselines)


# Seat 0 writes an invalid answer, is let retry, and wins 2; seat 1 loses. A second game is a plain loss.
RETRIED = [
    traj((2.0, -2.0), [turn(0, retried_penalty=-1.5, prompt=(5,)), turn(0, prompt=(6,)), turn(1)], seed=1),
    traj((-1.0, 1.0), [turn(0, prompt=(6,)), turn(1)], seed=1),
]


@pytest.mark.parametrize(("name", "state_prior"), ORDERINGS)
def test_no_estimator_credits_a_retried_invalid_answer_with_the_game_its_retry_won(name, state_prior):
    advantages, _ = estimate(name, RETRIED, {}, state_prior=state_prior)
    retried, retry = advantages[0][:2]
    assert retried < 0 < retry


def test_a_retried_invalid_answer_is_scored_by_its_penalty_as_a_unit_of_its_own():
    assert reinforce(RETRIED) == [(-1.5, 2.0, -2.0), (-1.0, 1.0)]
    advantages, baselines = rae(RETRIED, {P0: 0.5}, decay=0.5)
    assert_close(advantages, [(-2.0, 1.5, -2.0), (-1.5, 1.0)])
    # Seat 0's baseline moves three steps towards the mean of -1.5, 2 and -1 (the retried attempt counts once).
    assert baselines == close({P0: 0.125 * 0.5 + 0.875 * (-0.5 / 3), P1: 0.75 * (-0.5)})
    # turn_level (bonus 0.1): the attempt is worth its penalty alone, outside its seat's returns-to-go:
    # player_0's values -1.5, 0.1 + 2 and 0.1 - 1 (mean -0.1, std sqrt(2.48)); player_1's -1.9 and 1.1.
    std = 2.48**0.5
    assert_close(turn_level_returns(RETRIED, valid_turn_bonus=0.1), [(-1.4 / std, 2.2 / std, -1.0), (-0.8 / std, 1.0)])


def test_estimate_dispatches_with_the_given_settings():
    batch = GROUPED[:3]
    assert estimate("dr_grpo", batch, {})[0] == grpo(batch, scale=False)
    assert estimate("grpo", batch, {})[0] == grpo(batch)
    assert estimate("rae", batch, {}, decay=0.5) == rae(batch, {}, decay=0.5)
    by_game = estimate("trr++", batch, {}, key=lambda t: t.game)[0]
    assert by_game == trr_plus_plus(batch, key=lambda t: t.game)


def test_estimate_rejects_an_unknown_name_listing_the_valid_ones():
    with pytest.raises(UserError, match="ppo") as error:
        estimate("ppo", [], {})
    assert all(name in str(error.value) for name in ESTIMATORS)


def test_turn_discount_scales_each_turn_by_its_seats_later_turns():
    # First game: seat 0 moves at turns 0, 2, 4 and seat 1 at 1, 3; second game: seat 1 moves twice,
    # then seat 0. RAE from baselines 0.5 and -0.5 gives A = 0.5 and -0.5 in the first game and
    # -1.5 and 1.5 in the second. Each is then scaled by 0.5 ** (its seat's later turns).
    batch = [alternating((1.0, -1.0), 5), traj((-1.0, 1.0), [turn(1), turn(1), turn(0)])]
    start = {P0: 0.5, P1: -0.5}
    advantages, baselines = estimate("rae", batch, start, decay=0.5, turn_discount=0.5)
    assert advantages == [(0.125, -0.25, 0.25, -0.5, 0.5), (0.75, 1.5, -1.5)]
    # Each baseline takes two steps of 0.5 towards its returns' mean, 0.
    assert baselines == rae(batch, start, decay=0.5)[1] == {P0: 0.125, P1: -0.125}


def test_turn_discount_of_one_changes_nothing():
    assert estimate("grpo", GROUPED[:3], {}, turn_discount=1.0) == estimate("grpo", GROUPED[:3], {})


def test_the_default_key_is_game_and_role():
    assert game_and_role(turn(1, game="kuhn")) == ("kuhn", "player_1")


def test_advantage_stats():
    stats = advantage_stats([(1.0, 0.0), (), (-1.0, 0.0)])
    assert stats == close({"mean": 0.0, "std": 0.707106781, "min": -1.0, "max": 1.0, "zero_fraction": 0.5})
    zeros = {"mean": 0.0, "std": 0.0, "min": 0.0, "max": 0.0, "zero_fraction": 0.0}
    assert advantage_stats([]) == zeros
    assert advantage_stats([()]) == zeros
