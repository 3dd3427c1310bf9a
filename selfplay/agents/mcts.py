"""Monte Carlo tree search on a game's OpenSpiel twin, with OpenSpiel's C++ bots.

Perfect-information games get `pyspiel.MCTSBot` (UCT with random rollouts); games with
hidden information get `pyspiel.ISMCTSBot`, which searches over worlds resampled from the
player's information state and so needs the game to implement that resampling.
"""

from __future__ import annotations

import pyspiel

from selfplay.agents.base import Agent, IncompatibleAgentError
from selfplay.games import TextGame, TextGameEnv
from selfplay.games.openspiel_game import OpenSpielGame, native_errors_held

# OpenSpiel's own default exploration constant for UCT with rollouts.
_UCT_C = 2.0
_MAX_MEMORY_MB = 1000
_SEED_BOUND = 2**31


class MCTSAgent(Agent):
    """Searches `simulations` playouts from the current state and plays the best move."""

    DEFAULT_SIMULATIONS = 100

    def __init__(self, game: TextGame, seed: int, simulations: int = DEFAULT_SIMULATIONS):
        super().__init__(game, seed)
        refusal = self.refusal(game)
        if refusal:
            raise IncompatibleAgentError(refusal)
        self.twin = game
        self.simulations = simulations
        spiel_game = game.spiel_game
        evaluator = pyspiel.RandomRolloutEvaluator(1, self._seed())
        information = spiel_game.get_type().information
        if information == pyspiel.GameType.Information.PERFECT_INFORMATION:
            self.bot: pyspiel.Bot = pyspiel.MCTSBot(
                spiel_game,
                evaluator,
                uct_c=_UCT_C,
                max_simulations=simulations,
                max_memory_mb=_MAX_MEMORY_MB,
                solve=True,
                seed=self._seed(),
                verbose=False,
            )
        else:
            self.bot = pyspiel.ISMCTSBot(self._seed(), evaluator, uct_c=_UCT_C, max_simulations=simulations)

    @staticmethod
    def refusal(game: TextGame) -> str | None:
        """Why mcts cannot play `game`, or None."""
        if not isinstance(game, OpenSpielGame):
            return f"mcts searches a game's OpenSpiel twin, and {type(game).__name__} has none"
        if game.simultaneous_game is not None:
            return f"mcts searches turn-based games, and '{game.defined_game}' has simultaneous moves"
        spiel_game = game.spiel_game
        if spiel_game.get_type().information != pyspiel.GameType.Information.PERFECT_INFORMATION:
            if not _resamples(spiel_game):
                return (
                    f"mcts on a game with hidden information needs OpenSpiel to resample states from "
                    f"information states, which '{spiel_game}' does not implement"
                )
        return None

    def _seed(self) -> int:
        return int(self.rng.integers(_SEED_BOUND))

    def act(self, env: TextGameEnv) -> str:
        action = self.bot.step(self.twin.state)
        return env.answer(self.twin.move_name(action))


def _resamples(spiel_game: pyspiel.Game) -> bool:
    """Whether ISMCTS can resample worlds from this game's information states."""
    state = spiel_game.new_initial_state()
    while state.is_chance_node():
        state.apply_action(state.chance_outcomes()[0][0])
    try:
        with native_errors_held():
            state.resample_from_infostate(state.current_player(), lambda: 0.5)
    except pyspiel.SpielError:
        return False
    return True
