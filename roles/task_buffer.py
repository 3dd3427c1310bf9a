"""The task buffer of the proposer/solver game: seed tasks plus every validated proposal.

Proposers are shown a few tasks from the buffer and asked for a different one (as in
Absolute Zero). Diversity collapse, proposers writing the same few tasks again, is what
Absolute Zero's users report, so the buffer counts, since it was last asked: proposals,
valid ones, distinct valid proposals and distinct answers among them, valid ones new to the
buffer, and the solvers' attempts on them (right, wrong, unreadable).

One buffer per domain is shared by every game of that domain in the process (`shared`), so
the rollout engine's many concurrent games grow one buffer.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from selfplay.roles.domains import Task


class TaskBuffer:
    def __init__(self, seeds: Sequence[Task]):
        self.tasks: list[Task] = list(seeds)
        self._keys = {task.key for task in seeds}
        self._recent: list[Task | None] = []  # proposals since the last `metrics` call
        self._new = 0  # of them, valid tasks the buffer did not hold
        self._attempts: list[bool | None] = []  # solver results since then: right, wrong, unreadable

    def sample(self, rng: np.random.Generator, k: int, task_type: str | None = None) -> list[Task]:
        """Up to `k` distinct tasks (of `task_type`, when given), drawn uniformly."""
        pool = [t for t in self.tasks if task_type is None or t.task_type == task_type]
        chosen = rng.choice(len(pool), size=min(k, len(pool)), replace=False) if pool else []
        return [pool[i] for i in chosen]

    def __contains__(self, task: Task) -> bool:
        return task.key in self._keys

    def record(self, task: Task | None) -> None:
        """A proposal: the validated task, or None for an invalid one. New tasks join the buffer."""
        self._recent.append(task)
        if task is not None and task not in self:
            self._new += 1
            self._keys.add(task.key)
            self.tasks.append(task)

    def record_attempts(self, results: Sequence[bool | None]) -> None:
        self._attempts.extend(results)

    def metrics(self) -> dict[str, float]:
        """Proposal figures since the last call (validity, distinct proposals and answers among
        the valid ones), solver accuracy and unreadable rate, and the buffer's size."""
        recent, self._recent = self._recent, []
        attempts, self._attempts = self._attempts, []
        new, self._new = self._new, 0
        valid = [t for t in recent if t is not None]
        figures = {"buffer_size": float(len(self.tasks))}
        if recent:
            figures["proposals"] = float(len(recent))
            figures["valid_rate"] = len(valid) / len(recent)
        if valid:
            figures["distinct_proposals"] = len({t.key for t in valid}) / len(valid)
            figures["distinct_answers"] = len({t.answer for t in valid}) / len(valid)
            figures["new_to_buffer"] = new / len(valid)
        if attempts:
            figures["solver_accuracy"] = sum(r is True for r in attempts) / len(attempts)
            figures["solver_unreadable"] = sum(r is None for r in attempts) / len(attempts)
        return figures


_SHARED: dict[str, TaskBuffer] = {}


def shared(domain) -> TaskBuffer:
    """The process's buffer for `domain` (a `Domain`), started from its seed tasks."""
    if domain.name not in _SHARED:
        _SHARED[domain.name] = TaskBuffer(domain.seed_tasks())
    return _SHARED[domain.name]
