"""An approximate Nash equilibrium, solved with OpenSpiel's CFR+ on a game's OpenSpiel twin.

Only two-player zero-sum games with hidden information, small enough to solve in seconds,
qualify: there an equilibrium policy is a sound, unexploitable opponent, and CFR+ nears one
quickly. At the default 100
iterations Kuhn Poker solves to an exploitability of about 0.001 in milliseconds, Leduc
Hold'em to about 0.013 in about a second; Liar's Dice takes about 0.1 s an iteration.

Solved policies are kept for the life of the process, so every agent and series of the
same game and iteration count shares one solve.
"""

from __future__ import annotations

import functools

import numpy as np
import pyspiel

from selfplay.agents.base import Agent, IncompatibleAgentError
from selfplay.games import TextGame, TextGameEnv
from selfplay.games.openspiel_game import OpenSpielGame

_ZERO_SUM = (pyspiel.GameType.Utility.ZERO_SUM, pyspiel.GameType.Utility.CONSTANT_SUM)
# CFR+ visits every history each iteration, about 3 million a second: histories times iterations
# within this budget solve in about ten seconds (Liar's Dice, 294,883 histories, at 100 iterations).
_SOLVE_BUDGET = 30_000_000
_MAX_COUNTED_HISTORIES = 1_000_000  # counting them costs about 2.5 s a million


@functools.cache
def count_histories(game_string: str, limit: int) -> int | None:
    """The number of histories (chance and terminal included) of the game, or None above `limit`."""
    stack, count = [pyspiel.load_game(game_string).new_initial_state()], 0
    while stack:
        state = stack.pop()
        count += 1
        if count > limit:
            return None
        if not state.is_terminal():
            actions = [a for a, _ in state.chance_outcomes()] if state.is_chance_node() else state.legal_actions()
            stack += [state.child(a) for a in actions]
    return count


@functools.cache
def solve(game_string: str, iterations: int) -> pyspiel.TabularPolicy:
    """The CFR+ average policy of the OpenSpiel game `game_string` after `iterations`."""
    solver = pyspiel.CFRPlusSolver(pyspiel.load_game(game_string))
    for _ in range(iterations):
        solver.evaluate_and_update_policy()
    # A copy: `average_policy()` reads the solver's tables and dangles once the solver is freed.
    return solver.tabular_average_policy()


@functools.cache
def exploitability(game_string: str, iterations: int) -> float:
    """How much a best responder wins against `solve(game_string, iterations)`, summed over
    both seats (0 at an exact equilibrium)."""
    return pyspiel.exploitability(pyspiel.load_game(game_string), solve(game_string, iterations))


class NashAgent(Agent):
    """Plays by sampling the CFR+ approximate-equilibrium policy at its information state."""

    DEFAULT_ITERATIONS = 100

    def __init__(self, game: TextGame, seed: int, iterations: int = DEFAULT_ITERATIONS):
        super().__init__(game, seed)
        refusal = self.refusal(game, iterations)
        if refusal:
            raise IncompatibleAgentError(refusal)
        self.twin = game
        self.game_string = str(game.spiel_game)
        self.iterations = iterations
        self.policy = solve(self.game_string, iterations)

    @staticmethod
    def refusal(game: TextGame, iterations: int = DEFAULT_ITERATIONS) -> str | None:
        """Why nash cannot play `game` (at `iterations` CFR+ iterations), or None."""
        if not isinstance(game, OpenSpielGame):
            return f"nash solves a game's OpenSpiel twin, and {type(game).__name__} has none"
        spiel_game = game.spiel_game
        kind = spiel_game.get_type()
        if kind.information == pyspiel.GameType.Information.PERFECT_INFORMATION:
            return f"nash solves games with hidden information, and '{spiel_game}' has none"
        if kind.utility not in _ZERO_SUM or spiel_game.num_players() != 2:
            return f"nash needs a two-player zero-sum game, and '{spiel_game}' is not one"
        limit = min(_MAX_COUNTED_HISTORIES, _SOLVE_BUDGET // iterations)
        if count_histories(str(spiel_game), limit) is None:
            return (
                f"'{spiel_game}' has more than {limit} histories, too many for CFR+ to solve in a few seconds at "
                f"{iterations} iterations"
            )
        return None

    @property
    def exploitability(self) -> float:
        """The solved policy's exploitability (computed once per game and iteration count)."""
        return exploitability(self.game_string, self.iterations)

    def action_probabilities(self) -> dict[int, float]:
        """The policy at the twin's current state: OpenSpiel action id -> probability."""
        return dict(sorted(self.policy.action_probabilities(self.twin.state).items()))

    def act(self, env: TextGameEnv) -> str:
        actions, probs = zip(*self.action_probabilities().items())
        probs = np.asarray(probs) / sum(probs)
        action = actions[self.rng.choice(len(actions), p=probs)]
        return env.answer(self.twin.move_name(action))
