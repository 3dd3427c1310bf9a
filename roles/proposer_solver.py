"""The proposer and solver roles (after Absolute Zero): one policy writes tasks for itself.

The proposer writes a task in a verifiable domain; each of N solver seats attempts it once.
- Solver: 1 if its answer is correct, else 0; `format_penalty` if its output cannot be read.
- Proposer, `learnability` (Absolute Zero's): 1 - s when the solvers' success rate s is
  strictly between 0 and 1, else 0 (a task every attempt solves, or none does, teaches
  nothing); `difficulty`: 1 - s; `format_penalty` for a task that does not parse or run.
  With `novel_only`, a task already in the task buffer earns the proposer 0: a counter to
  proposers collapsing onto a few easy tasks.
"""

from __future__ import annotations

from selfplay.roles.base import Outcome, Role, register

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
