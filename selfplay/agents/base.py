"""The agent interface every player shares: scripted opponents now, LLM policies later."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from selfplay.errors import UserError
from selfplay.games import TextGame, TextGameEnv


class IncompatibleAgentError(UserError):
    """An agent cannot play a game (for example MCTS on a game with no OpenSpiel twin)."""


class Agent(ABC):
    """Writes the answer text for the player to move in a `TextGameEnv`.

    An agent is built for one game (`game`), so that search and solver agents can check and
    prepare what they need up front, and draws all randomness from its own seeded generator.
    """

    def __init__(self, game: TextGame, seed: int):
        self.game = game
        self.rng = np.random.default_rng(seed)

    @abstractmethod
    def act(self, env: TextGameEnv) -> str:
        """The raw output for `env.agent_selection`, as a model would write it."""
