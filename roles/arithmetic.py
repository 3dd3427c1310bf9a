"""Arithmetic: one seat answers one expression, scored exactly. A single-turn task with a
verifiable reward, the kind RLVR trainers such as TRL's GRPOTrainer train on: selfplay trains
on it as a one-seat game, and `benchmarks/vs_trl.py` runs both on the same expressions."""

from __future__ import annotations

import numpy as np

from selfplay.games.answers import AnswerGrammar
from selfplay.games.base import TextGame
from selfplay.roles.domains import Arithmetic as ArithmeticDomain
from selfplay.roles.domains import Task
from selfplay.roles.proposer_solver import solver

UNREADABLE = ""  # the move standing for output that holds no whole number
EXAMPLE_MOVES = 8


class Arithmetic(TextGame):
    """Arithmetic: answer an expression of 2 to 4 whole numbers from 0 to 20 with +, - and *.

    One seat (role `solver`) sees the expression and answers once: 1 if right, else 0;
    `format_penalty` (default 0) for output that holds no whole number.
    """

    num_players = 1
    agent_names = ("solver",)
    roles = ("solver",)
    observation_shape = (1,)
    zero_sum = False
    judged_by_return = True
    lists_every_move = False
    max_length = 1

    def __init__(self, format_penalty: float = 0.0):
        self.domain = ArithmeticDomain()
        self.role = solver(float(format_penalty))
        self.answer_format = self.domain.answer_format
        self.rules = (
            "You are shown one arithmetic expression over whole numbers. Objective: answer with its value. "
            f"You score 1 if right, 0 if wrong, {float(format_penalty):g} if no whole number can be read."
        )
        self.task: Task | None = None
        self.example_seed = 0
        self.answered: str | None = None

    def reset(self, rng: np.random.Generator) -> None:
        (proposal,) = self.domain.example_proposals(rng, "evaluate", 1)
        self.task = self.domain.read_proposal(proposal, "evaluate")
        self.example_seed = int(rng.integers(2**31))
        self.answered = None

    def current_player(self) -> int:
        return 0

    def legal_moves(self) -> list[str]:
        """Example answers (the game takes any whole number), the same each time the state is asked."""
        rng = np.random.default_rng(self.example_seed)
        return list(dict.fromkeys(self.domain.example_answers(self.task, rng, EXAMPLE_MOVES)))

    def answer_grammar(self) -> AnswerGrammar:
        return self.domain.answer_grammar(self.task)

    def parse_move(self, answer: str) -> str | None:
        text = answer.strip()
        return text if self.domain.readable(self.task, text) else None

    def unreadable_move(self) -> str:
        return UNREADABLE

    def apply(self, move: str) -> None:
        self.answered = move

    def is_over(self) -> bool:
        return self.answered is not None

    def returns(self) -> list[float]:
        readable = self.answered != UNREADABLE
        correct = readable and self.domain.check(self.task, self.answered)
        return [self.role.reward({"readable": readable, "correct": correct})]

    def describe(self, player: int) -> str:
        return self.role.instructions.format(
            domain=self.domain.name, task=self.task.statement, answer_help=self.domain.answer_help(self.task)
        )

    def moves_prompt(self) -> str:
        return "Write your answer."

    def observation_tensor(self, player: int) -> np.ndarray:
        return np.array([float(self.answered is not None)], dtype=np.float32)
