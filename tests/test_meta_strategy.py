"""League meta-strategies: Nash mixtures of matrix games solved by hand, and the behaviour policy
of a mixture of Kuhn Poker policies checked against hand-computed reach weights, OpenSpiel's
PolicyAggregator and the payoffs of its components."""

from __future__ import annotations

import numpy as np
import pytest
from open_spiel.python.algorithms.expected_game_score import policy_value
from open_spiel.python.algorithms.policy_aggregator import PolicyAggregator

from selfplay.evaluation.exploitability import exploitability_of, tabular_policy
from selfplay.evaluation.meta_solvers import SOLVERS, solve, zero_sum_nash
from selfplay.evaluation.meta_strategy import mixture_probabilities

NAN = np.nan
PASS, BET = 0, 1
# Kuhn Poker's information states: the player's card (0 = J, 1 = Q, 2 = K), then the moves so far.
FIRST = ["0", "1", "2"]  # player 0's opening
AFTER_CHECK_BET = ["0pb", "1pb", "2pb"]  # player 0 facing a bet after checking
SECOND = ["0p", "0b", "1p", "1b", "2p", "2b"]  # player 1
KUHN = FIRST + AFTER_CHECK_BET + SECOND


def bets(probability: float) -> dict[int, float]:
    return {PASS: 1.0 - probability, BET: probability}


def kuhn_policy(**bet_probability: float) -> dict[str, dict[int, float]]:
    """A Kuhn policy betting (or calling) with the given probability at each group of states."""
    groups = {"first": FIRST, "after_check_bet": AFTER_CHECK_BET, "second": SECOND}
    return {key: bets(bet_probability[name]) for name, keys in groups.items() for key in keys}


def random_kuhn_policy(rng: np.random.Generator) -> dict[str, dict[int, float]]:
    return {key: bets(rng.uniform(0.05, 0.95)) for key in KUHN}


def kuhn_equilibrium(alpha: float) -> dict[str, dict[int, float]]:
    """Kuhn's family of equilibria (alpha in [0, 1/3]): player 0 bluffs the J with alpha, bets the
    K with 3 alpha and calls with the Q with alpha + 1/3; player 1's strategy is fixed."""
    return {
        "0": bets(alpha),
        "1": bets(0.0),
        "2": bets(3 * alpha),
        "0pb": bets(0.0),
        "1pb": bets(alpha + 1 / 3),
        "2pb": bets(1.0),
        "0p": bets(1 / 3),
        "0b": bets(0.0),
        "1p": bets(0.0),
        "1b": bets(1 / 3),
        "2p": bets(1.0),
        "2b": bets(1.0),
    }


def assert_same_policy(actual, expected):
    assert set(actual) == set(expected)
    for key, actions in expected.items():
        assert actual[key] == pytest.approx(actions, abs=1e-12), key


def test_rock_paper_scissors_is_uniform_with_value_zero():
    mixture, value = zero_sum_nash(np.array([[0, -1, 1], [1, 0, -1], [-1, 1, 0]]))
    assert mixture == pytest.approx([1 / 3] * 3)
    assert value == pytest.approx(0.0, abs=1e-9)


def test_matching_pennies_is_an_even_mixture():
    mixture, value = zero_sum_nash(np.array([[1, -1], [-1, 1]]))
    assert mixture == pytest.approx([0.5, 0.5])
    assert value == pytest.approx(0.0, abs=1e-9)


def test_a_dominated_strategy_gets_no_weight():
    # Row 2 does worse than row 0 against every column; the rest is matching pennies.
    mixture, value = zero_sum_nash(np.array([[1, -1], [-1, 1], [0.5, -2]]))
    assert mixture == pytest.approx([0.5, 0.5, 0.0], abs=1e-9)
    assert value == pytest.approx(0.0, abs=1e-9)


def test_a_two_by_two_game_without_saddle_point():
    # Row 0 with probability p wins 3p - 2(1 - p) against column 0 and -p + (1 - p) against column 1;
    # the two are equal at p = 3/7, where both give 1/7 (pure play secures only -1).
    mixture, value = zero_sum_nash(np.array([[3, -1], [-2, 1]]))
    assert mixture == pytest.approx([3 / 7, 4 / 7])
    assert value == pytest.approx(1 / 7)


def test_a_pure_saddle_point():
    # Row 0 secures 2 whatever the column, and column 0 holds row 0 to 2.
    mixture, value = zero_sum_nash(np.array([[2, 3], [1, 4]]))
    assert mixture == pytest.approx([1.0, 0.0], abs=1e-9)
    assert value == pytest.approx(2.0)


def test_identical_strategies_share_their_weight_evenly():
    # Two copies of one player, which only draw: every mixture is maximin, and the copies split it.
    mixture, value = zero_sum_nash(np.zeros((2, 2)))
    assert mixture == pytest.approx([0.5, 0.5]) and value == pytest.approx(0.0, abs=1e-9)
    # Rock, paper and scissors twice (a copy of a snapshot): the scissors' third is split between the
    # copies, the copies' rows differing by less than a rounding error.
    scissors = [-1, 1, 0, 0]
    doubled = np.array([[0, -1, 1, 1], [1, 0, -1, -1], scissors, np.add(scissors, 1e-12)])
    mixture, value = zero_sum_nash(doubled)
    assert mixture == pytest.approx([1 / 3, 1 / 3, 1 / 6, 1 / 6]) and value == pytest.approx(0.0, abs=1e-9)
    # A dominated strategy's copies get nothing, and the rest keeps its order.
    mixture, _ = zero_sum_nash(np.array([[0.5, -2], [1, -1], [0.5, -2], [-1, 1]]))
    assert mixture == pytest.approx([0, 0.5, 0, 0.5], abs=1e-9)


@pytest.mark.parametrize("payoff", [np.zeros((0, 2)), np.zeros(3), np.array([[1.0, NAN]])])
def test_zero_sum_nash_rejects_malformed_matrices(payoff):
    with pytest.raises(ValueError):
        zero_sum_nash(payoff)


ROCK_PAPER_SCISSORS_AND_A_DUD = np.array(
    [[0, -1, 1, 1], [1, 0, -1, 1], [-1, 1, 0, 1], [-1, -1, -1, 0]], dtype=float
)  # the dud loses 1 to each of rock, paper and scissors


@pytest.mark.slow
@pytest.mark.parametrize("solver", SOLVERS)
def test_each_meta_solver_plays_rock_paper_scissors_uniformly_and_never_the_dud(solver):
    # PRD's answer is a time average that starts uniform and keeps every strategy above a floor,
    # so the dud keeps a trace of weight.
    tolerance = 1e-2 if solver == "prd" else 1e-9
    assert solve(solver, ROCK_PAPER_SCISSORS_AND_A_DUD) == pytest.approx([1 / 3] * 3 + [0], abs=tolerance)


@pytest.mark.slow
@pytest.mark.parametrize("solver", SOLVERS)
def test_each_meta_solver_puts_the_weight_on_a_strategy_that_beats_every_other(solver):
    transitive = np.array([[0, 1, 1], [-1, 0, 1], [-1, -1, 0]], dtype=float)
    tolerance = 2e-2 if solver == "prd" else 1e-9
    assert solve(solver, transitive) == pytest.approx([1, 0, 0], abs=tolerance)
    assert solve(solver, np.zeros((1, 1))) == pytest.approx([1.0])


@pytest.mark.parametrize("payoff", [np.zeros((2, 3)), np.zeros((0, 0)), np.array([[0.0, NAN], [NAN, 0.0]])])
def test_meta_solvers_refuse_what_is_not_a_square_finite_meta_game(payoff):
    with pytest.raises(ValueError):
        solve("nash", payoff)


def test_a_mixture_of_a_policy_with_itself_is_that_policy():
    policy = kuhn_policy(first=1.0, after_check_bet=0.3, second=0.0)  # "0pb" etc. never reached
    assert_same_policy(mixture_probabilities("kuhn_poker", [policy, policy], [0.3, 0.7]), policy)


def test_weight_on_one_policy_gives_that_policy():
    always_bet = kuhn_policy(first=1.0, after_check_bet=0.8, second=1.0)
    always_pass = kuhn_policy(first=0.0, after_check_bet=0.2, second=0.0)
    assert_same_policy(mixture_probabilities("kuhn_poker", [always_bet, always_pass], [1, 0]), always_bet)


def test_a_later_state_follows_the_policies_that_reach_it():
    always_bet = kuhn_policy(first=1.0, after_check_bet=0.8, second=0.5)
    always_check = kuhn_policy(first=0.0, after_check_bet=0.2, second=0.5)
    mixed = mixture_probabilities("kuhn_poker", [always_bet, always_check], [0.5, 0.5])
    for key in FIRST:
        assert mixed[key] == pytest.approx(bets(0.5))
    # Only the policy that checks gets to face a bet after checking: its 0.2, not the average 0.5.
    for key in AFTER_CHECK_BET:
        assert mixed[key] == pytest.approx(bets(0.2))
    for key in SECOND:
        assert mixed[key] == pytest.approx(bets(0.5))


def test_reach_weights_for_mixed_policies():
    # Checking first with 1/4 and 3/4, the weights at a bet after checking are 1/2 * 1/4 and
    # 1/2 * 3/4: the call probability is (1/8 * 1 + 3/8 * 0) / (1/2) = 1/4, not the average 1/2.
    bold = kuhn_policy(first=0.75, after_check_bet=1.0, second=0.5)
    timid = kuhn_policy(first=0.25, after_check_bet=0.0, second=0.5)
    mixed = mixture_probabilities("kuhn_poker", [bold, timid], [1, 1])
    for key in AFTER_CHECK_BET:
        assert mixed[key] == pytest.approx(bets(0.25))


def test_agrees_with_openspiels_policy_aggregator():
    rng = np.random.default_rng(0)
    policies = [random_kuhn_policy(rng) for _ in range(3)]
    weights = [0.2, 0.5, 0.3]
    tabular = [tabular_policy("kuhn_poker", p) for p in policies]
    aggregated = PolicyAggregator(tabular[0].game).aggregate([0, 1], [tabular, tabular], [weights, weights])
    expected = {key: actions for per_player in aggregated.policy for key, actions in per_player.items()}
    mixed = mixture_probabilities("kuhn_poker", policies, weights)
    assert set(mixed) == set(expected)
    for key, actions in expected.items():
        assert mixed[key] == pytest.approx(actions, abs=1e-12), key


@pytest.mark.parametrize("seat", [0, 1])
def test_the_mixture_scores_what_its_components_score_on_average(seat):
    # Kuhn's theorem: against any opponent, the behaviour policy wins what drawing a policy wins.
    rng = np.random.default_rng(1)
    policies = [random_kuhn_policy(rng) for _ in range(2)]
    opponent = tabular_policy("kuhn_poker", random_kuhn_policy(rng))
    weights = np.array([0.3, 0.7])

    def value(probabilities):
        seats = [opponent, opponent]
        seats[seat] = tabular_policy("kuhn_poker", probabilities)
        return policy_value(opponent.game.new_initial_state(), seats)[seat]

    mixed = mixture_probabilities("kuhn_poker", policies, weights)
    assert value(mixed) == pytest.approx(weights @ [value(p) for p in policies], abs=1e-12)


def test_a_mixture_of_equilibria_is_an_equilibrium():
    for alpha in (0.0, 1 / 3):
        assert exploitability_of("kuhn_poker", kuhn_equilibrium(alpha)) == pytest.approx(0.0, abs=1e-12)
    mixed = mixture_probabilities("kuhn_poker", [kuhn_equilibrium(0.0), kuhn_equilibrium(1 / 3)], [1, 1])
    assert exploitability_of("kuhn_poker", mixed) == pytest.approx(0.0, abs=1e-12)


def test_mixing_always_bet_and_always_pass_is_no_more_exploitable():
    always_bet = {key: bets(1.0) for key in KUHN}
    always_pass = {key: bets(0.0) for key in KUHN}
    pure = [exploitability_of("kuhn_poker", p) for p in (always_bet, always_pass)]
    mixed = exploitability_of("kuhn_poker", mixture_probabilities("kuhn_poker", [always_bet, always_pass], [1, 1]))
    # A best response's winnings are convex in the mixture, so they are at most the average.
    assert mixed <= sum(pure) / 2 + 1e-12
    assert mixed < max(pure)


@pytest.mark.parametrize(
    "policies, weights",
    [
        ([], []),
        ([{key: bets(0.5) for key in KUHN}], [1, 1]),
        ([{key: bets(0.5) for key in KUHN}], [0]),
        ([{key: bets(0.5) for key in KUHN}], [-1]),
        ([{key: bets(0.5) for key in KUHN}, {key: bets(0.5) for key in KUHN[1:]}], [1, 1]),
    ],
)
def test_mixture_probabilities_rejects_malformed_input(policies, weights):
    with pytest.raises(ValueError):
        mixture_probabilities("kuhn_poker", policies, weights)
