"""Uniform random play over the legal moves."""

from __future__ import annotations

from selfplay.agents.base import Agent
from selfplay.games import TextGameEnv


class RandomAgent(Agent):
    """Plays a legal move chosen uniformly at random."""

    def act(self, env: TextGameEnv) -> str:
        moves = env.legal_moves()
        return env.answer(moves[self.rng.integers(len(moves))])
