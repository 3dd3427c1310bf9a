"""Proposer / solver (after Absolute Zero): one policy proposes tasks and solves them; the game
and its two roles.

Seats: `proposer`, then `solver_0` ... `solver_{N-1}` (role `solver`). The proposer is shown a
few tasks from the domain's task buffer and writes a new one; the environment validates it
(for Python, in the sandbox) and computes its answer. Each solver then attempts the task
once, seeing only the task. Unreadable answers are scored by the game, not by the
environment's invalid-move policy, so the other solvers still play.

Rewards, from the roles:
- Solver: 1 if its answer is correct, else 0; `format_penalty` if its output cannot be read.
- Proposer, `learnability` (Absolute Zero's): 1 - s when the solvers' success rate s is
  strictly between 0 and 1, else 0 (a task every attempt solves, or none does, teaches
  nothing); `difficulty`: 1 - s; `format_penalty` for a task that does not parse or run (an
  invalid task ends the game at once). With `novel_only`, a task already in the task buffer
  earns the proposer 0: a counter to proposers collapsing onto a few easy tasks.

Only the final answer of a turn (`answer_format`) reaches the game; reasoning before it does
not. The game is not zero-sum.
"""

from __future__ import annotations

import numpy as np

from selfplay.errors import UserError
from selfplay.games.answers import AnswerGrammar
from selfplay.games.base import TextGame
from selfplay.roles.base import Outcome, Role, register
from selfplay.roles.domains import DOMAINS, Task
from selfplay.roles.sandbox import ISOLATIONS, shared_sandbox
from selfplay.roles.task_buffer import shared

UNREADABLE = ""  # the move standing for output the game could not read
MAX_ANSWER_CHARS = 2000
EXAMPLE_MOVES = 8

PROPOSER_INSTRUCTIONS = (
    "You are the proposer. Write one new {domain} task that is neither trivial nor impossible: "
    "{attempts} solvers will attempt it, and you score best when some but not all of them succeed.\n\n"
    "{task_help}\n\nTasks proposed before (write a different one):\n{references}"
)
SOLVER_INSTRUCTIONS = "You are a solver. Solve this {domain} task.\n\n{task}\n\n{answer_help}"


def learnability(success_rate: float) -> float:
    return 1.0 - success_rate if 0.0 < success_rate < 1.0 else 0.0


def difficulty(success_rate: float) -> float:
    return 1.0 - success_rate


PROPOSER_REWARDS = {"learnability": learnability, "difficulty": difficulty}


def proposer(reward: str = "learnability", format_penalty: float = -1.0, novel_only: bool = False) -> Role:
    """The proposer role; its outcome names `valid` (the task parsed and ran), `novel` (the
    task buffer did not hold it) and `success_rate`."""
    scheme = PROPOSER_REWARDS[reward]

    def score(outcome: Outcome) -> float:
        if not outcome["valid"]:
            return format_penalty
        return 0.0 if novel_only and not outcome["novel"] else scheme(outcome["success_rate"])

    return register(Role("proposer", PROPOSER_INSTRUCTIONS, score))


def solver(format_penalty: float = -1.0) -> Role:
    """A solver role; its outcome names `readable` (an answer could be read) and `correct`."""

    def score(outcome: Outcome) -> float:
        return float(outcome["correct"]) if outcome["readable"] else format_penalty

    return register(Role("solver", SOLVER_INSTRUCTIONS, score))


class ProposerSolver(TextGame):
    """Proposer/solver: one seat proposes a verifiable task (arithmetic, or Python programs), N seats solve it.

    Parameters: `domain` (arithmetic, python), `attempts` (solver seats, default 4), `task_type`
    (python: deduction, abduction or induction; default drawn per game), `proposer_reward`
    (learnability, difficulty), `format_penalty` (default -1), `references` (buffer tasks shown),
    `novel_only` (a task already in the buffer earns the proposer nothing), `sandbox` (where python
    tasks run: bubblewrap, an operating-system sandbox; or unsafe, a child process guarded only by an
    audit hook, which code written to attack it escapes).
    """

    observation_shape = (3,)
    zero_sum = False
    lists_every_move = False

    def __init__(
        self,
        domain: str = "arithmetic",
        attempts: int = 4,
        task_type: str | None = None,
        proposer_reward: str = "learnability",
        format_penalty: float = -1.0,
        references: int = 3,
        novel_only: bool = False,
        sandbox: str = "bubblewrap",
    ):
        if domain not in DOMAINS:
            raise UserError(f"proposer_solver: unknown domain '{domain}'; choose one of {', '.join(DOMAINS)}.")
        if sandbox not in ISOLATIONS:
            raise UserError(f"proposer_solver: sandbox must be one of {', '.join(ISOLATIONS)}, got {sandbox!r}.")
        self.domain = DOMAINS[domain](shared_sandbox(sandbox)) if DOMAINS[domain].runs_code else DOMAINS[domain]()
        if task_type is not None and task_type not in self.domain.task_types:
            raise UserError(
                f"proposer_solver: the {domain} domain has task types {', '.join(self.domain.task_types)}, "
                f"not '{task_type}'."
            )
        if not isinstance(attempts, int) or attempts < 2:
            raise UserError(f"proposer_solver: attempts must be a whole number of at least 2, got {attempts!r}.")
        if proposer_reward not in PROPOSER_REWARDS:
            raise UserError(
                f"proposer_solver: proposer_reward must be one of {', '.join(PROPOSER_REWARDS)}, "
                f"got {proposer_reward!r}."
            )
        self.fixed_task_type = task_type
        self.attempts = attempts
        self.references = references
        self.num_players = 1 + attempts
        self.agent_names = ("proposer", *(f"solver_{i}" for i in range(attempts)))
        if not isinstance(novel_only, bool):
            raise UserError(f"proposer_solver: novel_only must be true or false, got {novel_only!r}.")
        self.proposer_role = proposer(proposer_reward, format_penalty, novel_only)
        self.solver_role = solver(format_penalty)
        self.roles = (self.proposer_role.name, *(self.solver_role.name,) * attempts)
        self.answer_format = self.domain.answer_format
        self.buffer = shared(self.domain)
        self.rules = (
            f"A proposer writes a {self.domain.name} task; {attempts} solvers each attempt it once. Solvers score "
            "1 for a right answer and 0 for a wrong one. The proposer scores 1 minus the solvers' success rate "
            "when some but not all of them succeed, else 0. Output that cannot be read scores "
            f"{format_penalty:g}."
        )

    # -- state ---------------------------------------------------------------------------------

    def reset(self, rng: np.random.Generator) -> None:
        types = self.domain.task_types
        self.task_type = self.fixed_task_type or types[int(rng.integers(len(types)))]
        self.shown = self.buffer.sample(rng, self.references, self.task_type)
        self.example_seed = int(rng.integers(2**31))
        self.proposed = False
        self.novel = False
        self.task: Task | None = None
        self.results: list[bool | None] = []  # per solver: right, wrong, or unreadable (None)

    def current_player(self) -> int:
        return 0 if not self.proposed else 1 + len(self.results)

    def legal_moves(self) -> list[str]:
        """Example moves (the game takes any answer): well-formed proposals, or answers, drawn
        the same way each time the same state is asked."""
        rng = np.random.default_rng([self.example_seed, len(self.results)])
        if not self.proposed:
            examples = self.domain.example_proposals(rng, self.task_type, EXAMPLE_MOVES)
        else:
            examples = self.domain.example_answers(self.task, rng, EXAMPLE_MOVES)
        return list(dict.fromkeys(examples))

    def answer_grammar(self) -> AnswerGrammar:
        if not self.proposed:
            return self.domain.proposal_grammar(self.task_type)
        return self.domain.answer_grammar(self.task)

    def parse_move(self, answer: str) -> str | None:
        text = answer.strip()
        if not 0 < len(text) <= MAX_ANSWER_CHARS or (self.proposed and not self.domain.readable(self.task, text)):
            return None
        return text

    def unreadable_move(self) -> str:
        return UNREADABLE

    def apply(self, move: str) -> None:
        if not self.proposed:
            self.proposed = True
            self.task = self.domain.read_proposal(move, self.task_type) if move != UNREADABLE else None
            self.novel = self.task is not None and self.task not in self.buffer
            self.buffer.record(self.task)
        else:
            self.results.append(self.domain.check(self.task, move) if move != UNREADABLE else None)
            if len(self.results) == self.attempts:
                self.buffer.record_attempts(self.results)

    def is_over(self) -> bool:
        return self.proposed and (self.task is None or len(self.results) == self.attempts)

    def returns(self) -> list[float]:
        if self.task is None:
            outcome = {"valid": 0.0, "novel": 0.0, "success_rate": 0.0}
            return [self.proposer_role.reward(outcome), *[0.0] * self.attempts]
        success = sum(bool(r) for r in self.results) / self.attempts
        solvers = [self.solver_role.reward({"readable": r is not None, "correct": bool(r)}) for r in self.results]
        outcome = {"valid": 1.0, "novel": float(self.novel), "success_rate": success}
        return [self.proposer_role.reward(outcome), *solvers]

    # -- what each player sees -----------------------------------------------------------------

    def describe(self, player: int) -> str:
        if player == 0:
            if self.proposed:
                return "You proposed: " + (self.task.statement if self.task else "a task that was not valid.")
            references = "\n".join(f"- {t.statement}" for t in self.shown) or "(none yet)"
            return self.proposer_role.instructions.format(
                domain=self.domain.name,
                attempts=self.attempts,
                task_help=self.domain.task_help(self.task_type),
                references=references,
            )
        if self.task is None:
            return "You are a solver. Waiting for the proposer's task."
        return self.solver_role.instructions.format(
            domain=self.domain.name, task=self.task.statement, answer_help=self.domain.answer_help(self.task)
        )

    def moves_prompt(self) -> str:
        return "Write your task." if not self.proposed else "Write your answer."

    def observation_tensor(self, player: int) -> np.ndarray:
        return np.array([float(self.proposed), len(self.results), float(self.task is not None)], dtype=np.float32)

    def outcome_figures(self, seat: int) -> dict[str, float]:
        """The proposer's task validity and, for a valid task, the solvers' success rate on it; a
        solver's correctness."""
        if seat == 0:
            if self.task is None:
                return {"valid_task": 0.0}
            return {"valid_task": 1.0, "solve_rate": sum(bool(r) for r in self.results) / self.attempts}
        return {"correct": float(bool(self.results[seat - 1]))} if seat <= len(self.results) else {}

    def training_metrics(self) -> dict[str, float]:
        """The task buffer's figures since they were last read (see `TaskBuffer.metrics`), and the
        domain's own (the sandbox's runs and their cost)."""
        return {**self.buffer.metrics(), **self.domain.metrics()}
