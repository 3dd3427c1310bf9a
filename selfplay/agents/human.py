"""A person at the terminal, playing through the same text a model sees."""

from __future__ import annotations

import sys
from typing import TextIO

from selfplay.agents.base import Agent
from selfplay.errors import UserError
from selfplay.games import TextGame, TextGameEnv


class InputClosedError(UserError):
    """The human player's input ended before a legal move was given."""


class HumanAgent(Agent):
    """Shows the rules once and the state each turn, then reads a move.

    A move may be typed bare ("4", "bet") or in the game's answer format ("\\boxed{4}");
    anything that names no legal move is refused and asked for again.
    """

    def __init__(self, game: TextGame, seed: int, stdin: TextIO | None = None, stdout: TextIO | None = None):
        super().__init__(game, seed)
        self.stdin = sys.stdin if stdin is None else stdin
        self.stdout = sys.stdout if stdout is None else stdout
        self._shown_rules = False

    def act(self, env: TextGameEnv) -> str:
        observation = env.observe(env.agent_selection)
        if not self._shown_rules:
            self._shown_rules = True
            self._say(observation["rules"])
        self._say(observation["state"])
        while True:
            self.stdout.write("Your move: ")
            self.stdout.flush()
            line = self.stdin.readline()
            if not line:
                raise InputClosedError("Input ended before a move was given; the game was stopped.")
            text = line.strip()
            move = env.parse(text) or env.parse(env.answer(text))
            if move is not None:
                return env.answer(move)
            self._say(f"'{text}' is not a legal move. Legal moves: {', '.join(env.legal_moves())}")

    def _say(self, text: str) -> None:
        self.stdout.write(text + "\n\n")
        self.stdout.flush()
