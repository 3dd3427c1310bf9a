"""A league's meta-strategy: a mixture over its frozen snapshots, and the single policy it amounts to.

As in PSRO, the snapshots of a self-play league are the pure strategies of a meta-game whose
payoffs are their results against each other; the meta-strategy is the mixture a meta-solver
gives (`selfplay.evaluation.meta_solvers`: a Nash equilibrium of that zero-sum matrix game by
default, or projected replicator dynamics, or alpha-rank). To ask whether the league as a whole
is harder to exploit than its latest policy, the mixture (draw one snapshot per game, play it
throughout) is turned into the equivalent behaviour policy, whose exact exploitability
`selfplay.evaluation.exploitability.exploitability_of` computes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyspiel
from open_spiel.python.algorithms.expected_game_score import policy_value

from selfplay.evaluation.exploitability import exploitability_of, tabular_policy
from selfplay.evaluation.meta_solvers import solve


def mixture_probabilities(
    game: str, policies: Sequence[Mapping[str, Mapping[int, float]]], weights: Sequence[float]
) -> dict[str, dict[int, float]]:
    """The behaviour policy equivalent to drawing policy i with probability weights[i] once at the
    start of each game and playing it throughout: at each information state, the policies' move
    probabilities averaged with weights proportional to weights[i] times the probability of
    policy i's own earlier moves reaching that state (Kuhn's theorem).

    `policies` are in the shape `exploitability.move_probabilities` gives (information-state
    string -> {OpenSpiel action: probability}) and must cover exactly the information states of
    `game`; so does the result, with every legal action. `weights` need not sum to 1. At a state
    that no policy of positive weight reaches, where any move is equivalent, the policies are
    averaged by `weights` alone, so that a mixture of a policy with itself, or with weight only on
    it, returns that policy unchanged.

    This is what OpenSpiel's `PolicyAggregator` computes, except that it plays uniformly at such
    unreached states and adds 1e-40 to every probability.
    """
    if not policies or len(policies) != len(weights):
        raise ValueError(f"expected one weight per policy, got {len(policies)} policies and {len(weights)} weights")
    weight = np.asarray(weights, dtype=np.float64)
    if not np.isfinite(weight).all() or (weight < 0).any() or weight.sum() <= 0:
        raise ValueError(f"weights must be non-negative, finite and not all 0, got {list(weights)}")
    spiel_game = tabular_policy(game, policies[0]).game  # also checks the information states
    if any(set(p) != set(policies[0]) for p in policies[1:]):
        raise ValueError(f"the policies do not all cover exactly the information states of '{game}'")

    mixed: dict[str, dict[int, float]] = {}

    def walk(state: pyspiel.State, reach: np.ndarray) -> None:
        # reach[i][p]: the probability of policy i's own moves as player p on the way to `state`.
        # Chance and the opponent are left out: they weigh every policy alike.
        if state.is_terminal():
            return
        if state.is_chance_node():
            for action, _ in state.chance_outcomes():
                walk(state.child(action), reach)
            return
        player = state.current_player()
        key = state.information_state_string()
        actions = state.legal_actions()
        moves = np.array([[p[key].get(a, 0.0) for a in actions] for p in policies])
        # With perfect recall, as in the poker games, every history in an information state has the
        # same own reach, so its first visit decides.
        if key not in mixed:
            mass = weight * reach[:, player]
            if mass.sum() == 0:
                mass = weight
            mixed[key] = dict(zip(actions, (mass @ moves / mass.sum()).tolist()))
        for column, action in enumerate(actions):
            after = reach.copy()
            after[:, player] *= moves[:, column]
            walk(state.child(action), after)

    walk(spiel_game.new_initial_state(), np.ones((len(policies), spiel_game.num_players())))
    return mixed


def expected_payoffs(game: str, policies: Sequence[Mapping[str, Mapping[int, float]]]) -> np.ndarray:
    """payoff[i][j]: policy i's expected reward against policy j, averaged over the two seats,
    computed exactly over the game tree (OpenSpiel's `policy_value`, no sampling noise). For a
    zero-sum game the matrix is antisymmetric."""
    tabular = [tabular_policy(game, p) for p in policies]
    root = tabular[0].game.new_initial_state()
    payoff = np.zeros((len(tabular), len(tabular)))
    for i, first in enumerate(tabular):
        for j, second in enumerate(tabular):
            values = policy_value(root, [first, second])
            payoff[i, j] += values[0] / 2
            payoff[j, i] += values[1] / 2
    return payoff


@dataclass(frozen=True)
class MetaStrategy:
    """A meta-strategy over named policies, next to each policy's own exploitability."""

    names: tuple[str, ...]
    weights: tuple[float, ...]  # the meta-solver's mixture over `names`
    exploitability: float  # of the mixture, played as one behaviour policy
    exploitabilities: tuple[float, ...]  # of each policy alone


def meta_strategy(
    game: str, policies: Mapping[str, Mapping[str, Mapping[int, float]]], solver: str = "nash"
) -> MetaStrategy:
    """The mixture `solver` (a key of `meta_solvers.SOLVERS`) gives the meta-game between
    `policies` (exact expected payoffs), and the exploitability of the mixture and of each policy."""
    names = tuple(policies)
    probabilities = [policies[name] for name in names]
    weights = solve(solver, expected_payoffs(game, probabilities))
    mixture = mixture_probabilities(game, probabilities, weights)
    return MetaStrategy(
        names,
        tuple(weights.tolist()),
        exploitability_of(game, mixture),
        tuple(exploitability_of(game, p) for p in probabilities),
    )
