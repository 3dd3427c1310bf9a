"""An approximate Nash equilibrium, solved with OpenSpiel's CFR+ on a game's OpenSpiel twin.

Only two-player zero-sum games with hidden information qualify: there an equilibrium
policy is a sound, unexploitable opponent, and CFR+ nears one quickly. At the default 100
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
        if not isinstance(game, OpenSpielGame):
            raise IncompatibleAgentError(
                f"nash solves a game's OpenSpiel twin, and {type(game).__name__} has none; use random or human for it."
            )
        kind = game.spiel_game.get_type()
        if kind.information == pyspiel.GameType.Information.PERFECT_INFORMATION:
            raise IncompatibleAgentError(
                f"nash solves games with hidden information, and '{game.spiel_game}' has none; "
                f"use mcts or random for it."
            )
        if kind.utility not in _ZERO_SUM:
            raise IncompatibleAgentError(
                f"nash needs a zero-sum game, and '{game.spiel_game}' is not; use mcts or random for it."
            )
        self.twin = game
        self.game_string = str(game.spiel_game)
        self.iterations = iterations
        self.policy = solve(self.game_string, iterations)

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
