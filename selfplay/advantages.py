"""Advantage estimators: how much better than expected each language-model turn did.

Each estimator turns a batch of finished trajectories into one advantage per turn, which the
learner multiplies into the policy-gradient loss. They differ in the baseline they subtract:

- ``rae``: SPIRAL's role-conditioned advantage estimation, an EMA baseline per (game, role)
  carried from batch to batch (read at the batch's start, moved at its end), optionally refined
  per state where the batch repeats a prompt;
- ``turn_level``: MARS's per-turn rewards summed forward per player, then normalised per
  (game, role) across the batch;
- ``grpo`` / ``dr_grpo`` / ``rloo``: group baselines over repeated plays of the same game start;
- ``trr++``: Absolute Zero's whitening of returns per (task type x role) across the batch;
- ``reinforce``: the raw return, no baseline.

Any of them can weight a player's later turns above its earlier ones (``turn_discount``): each
turn's advantage is scaled by the discount to the power of the turns that player takes after it
in the game. The scale is positive and the same for every move of a state, so the best move
in each state stays the best; what changes is how fast each state learns. In short games the
last few decisions (completing a line, blocking one) settle most outcomes, and the earliest
carry the noisiest credit.

The unit an estimator scores is a seat's part of one trajectory: the turns that seat played,
with the seat's final return ``trajectory.result.rewards[seat]``. An invalid output that the
game let its player retry (``rollout.retries``) is a unit of its own, scored by the penalty it
would have ended the game with: the game its retry went on to play is not its doing. A seat
with no turns (an opponent the caller does not train, whose turns were stripped) touches no
baseline or statistic. Turns are grouped by ``key(turn)``, by default ``(game, role)``; a seat whose turns
fall under several keys counts once under each.

Pure functions of plain data, no torch.
"""

from __future__ import annotations

import math
import typing
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Literal

import numpy as np

from selfplay.errors import UserError
from selfplay.records import Trajectory, Turn
from selfplay.roles.base import game_and_role

Key = Hashable
KeyFn = Callable[[Turn], Hashable]
Advantages = list[tuple[float, ...]]  # one tuple per trajectory, one advantage per turn

# What `advantages.estimator` may name.
Estimator = Literal["rae", "turn_level", "grpo", "dr_grpo", "rloo", "trr++", "reinforce"]
ESTIMATORS: tuple[str, ...] = typing.get_args(Estimator)


def _scored_by(trajectory: Trajectory, index: int) -> tuple[tuple[int, ...], float]:
    """The unit turn `index` is scored in, and that unit's return: its seat's, with the seat's
    final return; or, for an invalid output the game let its player retry, a unit of its own
    with the penalty that output would have ended the game with (`Turn.retried_penalty`), so
    that a retried mistake is never credited with the game its retry went on to win."""
    turn = trajectory.turns[index]
    if turn.retried_penalty is None:
        return (turn.seat,), float(trajectory.result.rewards[turn.seat])
    return (turn.seat, index), turn.retried_penalty


def _parts(trajectory: Trajectory, key: KeyFn) -> list[tuple[Hashable, float, list[int]]]:
    """(key, return, indices of its turns) for each scored unit (`_scored_by`) and key with turns, in order of
    first turn."""
    parts: dict[tuple[tuple[int, ...], Hashable], tuple[float, list[int]]] = {}
    for index, turn in enumerate(trajectory.turns):
        unit, ret = _scored_by(trajectory, index)
        parts.setdefault((unit, key(turn)), (ret, []))[1].append(index)
    return [(k, ret, indices) for (_, k), (ret, indices) in parts.items()]


def _assemble(trajectories: Sequence[Trajectory], values: Iterable[tuple[int, list[int], float]]) -> Advantages:
    """Place (trajectory index, turn indices, advantage) triples into per-turn tuples."""
    table = [[0.0] * len(t.turns) for t in trajectories]
    for traj_index, indices, value in values:
        for index in indices:
            table[traj_index][index] = value
    return [tuple(row) for row in table]


def _whiten(values: Sequence[float], eps: float, scale: bool = True) -> list[float]:
    """Centre (and scale) a group of values; a lone value carries no comparison, so it gets 0."""
    if len(values) < 2:
        return [0.0] * len(values)
    array = np.asarray(values, dtype=np.float64)
    centred = array - array.mean()
    if scale:
        centred = centred / (array.std() + eps)
    return [float(v) for v in centred]


def _whiten_groups(groups: Mapping[Hashable, list[tuple[int, list[int], float]]], eps: float, scale: bool = True):
    """Whiten the values of each group of (trajectory index, turn indices, value) entries separately."""
    for entries in groups.values():
        for (traj_index, indices, _), value in zip(entries, _whiten([e[2] for e in entries], eps, scale)):
            yield traj_index, indices, value


def rae(
    trajectories: Sequence[Trajectory],
    baselines: Mapping[Key, float],
    decay: float = 0.95,
    key: KeyFn = game_and_role,
    state_prior: float | None = None,
) -> tuple[Advantages, dict[Key, float]]:
    """SPIRAL's role-conditioned advantages: A = R - b[key], then the baselines move towards the batch.

    Every advantage of a batch reads the baselines as they stood before it, and only then do
    they move, so that the baseline a turn is compared against never depends on the batch's
    order. That order is the order games finish, and a short game (a fold) finishes first: a
    baseline updated game by game would differ between a game's moves by how soon each ends
    the game. A key with n returns in the batch moves as n EMA steps whose returns were all
    the batch's mean: b <- decay**n * b + (1 - decay**n) * mean(R). Returns the advantages and
    the new baselines.

    With `state_prior`, a turn's baseline is instead the mean return of the batch's *other*
    seats that saw the same prompt, shrunk towards b[key] as if b[key] were `state_prior` more
    of them. Where states repeat (Kuhn Poker's twelve information states), this removes from
    the advantage what the state alone was worth (a King wins more than a Jack whatever it
    does), the noise that otherwise swamps the small differences between moves; a state seen
    once in the batch falls back to b[key]. Other games' returns are independent of this turn's
    move, so the baseline leaves the gradient unbiased.
    """
    by_state = _returns_by_state(trajectories, key) if state_prior is not None else {}
    returns: dict[Key, list[float]] = {}
    values = []
    for traj_index, trajectory in enumerate(trajectories):
        for k, ret, indices in _parts(trajectory, key):
            old = baselines.get(k, 0.0)
            returns.setdefault(k, []).append(ret)
            if state_prior is None:
                values.append((traj_index, indices, ret - old))
                continue
            for index in indices:
                total, count = by_state[k, trajectory.turns[index].prompt_ids]
                weight = count - 1 + state_prior
                baseline = (total - ret + state_prior * old) / weight if weight > 0 else old
                values.append((traj_index, [index], ret - baseline))
    updated = dict(baselines)
    for k, batch in returns.items():
        kept = decay ** len(batch)
        updated[k] = kept * updated.get(k, 0.0) + (1.0 - kept) * math.fsum(batch) / len(batch)
    return _assemble(trajectories, values), updated


def _returns_by_state(trajectories: Sequence[Trajectory], key: KeyFn) -> dict[tuple[Key, tuple], tuple[float, int]]:
    """(sum of returns, number of units) per key and prompt: each scored unit (`_scored_by`) counted once per
    prompt it saw."""
    seen: dict[tuple[Key, tuple], dict[tuple, float]] = {}
    for traj_index, trajectory in enumerate(trajectories):
        for index, turn in enumerate(trajectory.turns):
            unit, ret = _scored_by(trajectory, index)
            seen.setdefault((key(turn), turn.prompt_ids), {})[traj_index, unit] = ret
    return {state: (sum(returns.values()), len(returns)) for state, returns in seen.items()}


def turn_level_returns(
    trajectories: Sequence[Trajectory],
    key: KeyFn = game_and_role,
    valid_turn_bonus: float = 0.0,
    eps: float = 1e-6,
) -> Advantages:
    """MARS's turn-level returns: per-turn rewards summed forward per seat, normalised per key over the batch.
    A retried invalid output is scored by its penalty alone (`_scored_by`), outside its seat's sums."""
    groups: dict[Hashable, list[tuple[int, list[int], float]]] = {}
    for traj_index, trajectory in enumerate(trajectories):
        by_seat: dict[int, list[int]] = {}
        for index, turn in enumerate(trajectory.turns):
            if turn.retried_penalty is None:
                by_seat.setdefault(turn.seat, []).append(index)
            else:
                groups.setdefault(key(turn), []).append((traj_index, [index], turn.retried_penalty))
        for seat, indices in by_seat.items():
            turns = [trajectory.turns[i] for i in indices]
            rewards = [t.reward + (0.0 if t.invalid else valid_turn_bonus) for t in turns]
            # The game's outcome often lands after the opponent's reply, outside any of this seat's turns:
            # whatever of the final return the turn rewards have not paid yet belongs to the seat's last move.
            rewards[-1] += trajectory.result.rewards[seat] - sum(t.reward for t in turns)
            to_go = np.cumsum(rewards[::-1])[::-1]
            for index, turn, value in zip(indices, turns, to_go):
                groups.setdefault(key(turn), []).append((traj_index, [index], float(value)))
    return _assemble(trajectories, _whiten_groups(groups, eps))


def _start_groups(trajectories: Sequence[Trajectory], key: KeyFn) -> dict[Hashable, list[tuple[int, list[int], float]]]:
    """Seat returns grouped by key and game start (game, seed): repeated plays of the same position."""
    groups: dict[Hashable, list[tuple[int, list[int], float]]] = {}
    for traj_index, trajectory in enumerate(trajectories):
        for k, ret, indices in _parts(trajectory, key):
            group = (k, trajectory.result.game, trajectory.result.seed)
            groups.setdefault(group, []).append((traj_index, indices, ret))
    return groups


def grpo(
    trajectories: Sequence[Trajectory], key: KeyFn = game_and_role, scale: bool = True, eps: float = 1e-6
) -> Advantages:
    """GRPO: seat return minus its group's mean, divided by the group's std unless `scale` is off (Dr.GRPO)."""
    return _assemble(trajectories, _whiten_groups(_start_groups(trajectories, key), eps, scale))


def rloo(trajectories: Sequence[Trajectory], key: KeyFn = game_and_role) -> Advantages:
    """REINFORCE leave-one-out: seat return minus the mean return of the other members of its group."""
    values = []
    for entries in _start_groups(trajectories, key).values():
        total, n = sum(e[2] for e in entries), len(entries)
        for traj_index, indices, ret in entries:
            values.append((traj_index, indices, (ret - (total - ret) / (n - 1)) if n > 1 else 0.0))
    return _assemble(trajectories, values)


def trr_plus_plus(trajectories: Sequence[Trajectory], key: KeyFn = game_and_role, eps: float = 1e-6) -> Advantages:
    """Absolute Zero's TRR++: seat returns whitened separately per key (task type x role) over the batch."""
    groups: dict[Hashable, list[tuple[int, list[int], float]]] = {}
    for traj_index, trajectory in enumerate(trajectories):
        for k, ret, indices in _parts(trajectory, key):
            groups.setdefault(k, []).append((traj_index, indices, ret))
    return _assemble(trajectories, _whiten_groups(groups, eps))


def reinforce(trajectories: Sequence[Trajectory]) -> Advantages:
    """Plain REINFORCE: every turn gets its seat's final return (a retried invalid output its penalty)."""
    return [tuple(_scored_by(t, index)[1] for index in range(len(t.turns))) for t in trajectories]


def discount_turns(trajectories: Sequence[Trajectory], advantages: Advantages, discount: float) -> Advantages:
    """Scale each turn's advantage by `discount` ** (the turns its seat takes after it in its trajectory)."""
    scaled = []
    for trajectory, values in zip(trajectories, advantages):
        later: Counter[int] = Counter()
        row = list(values)
        for index in reversed(range(len(trajectory.turns))):
            seat = trajectory.turns[index].seat
            row[index] *= discount ** later[seat]
            later[seat] += 1
        scaled.append(tuple(row))
    return scaled


def estimate(
    name: str,
    trajectories: Sequence[Trajectory],
    baselines: Mapping[Key, float],
    *,
    decay: float = 0.95,
    key: KeyFn = game_and_role,
    turn_discount: float = 1.0,
    state_prior: float | None = None,
    valid_turn_bonus: float = 0.0,
) -> tuple[Advantages, dict[Key, float]]:
    """Run the estimator called `name`, each turn's advantage then scaled by `turn_discount` (see
    `discount_turns`); returns the advantages and the baselines to carry to the next batch.
    `decay` and `state_prior` are RAE's (see `rae`), `valid_turn_bonus` turn_level's. The config
    schema (`AdvantageConfig`) checks their ranges and which estimator takes which."""
    advantages, baselines = _estimate(name, trajectories, baselines, decay, key, state_prior, valid_turn_bonus)
    if turn_discount != 1.0:
        advantages = discount_turns(trajectories, advantages, turn_discount)
    return advantages, baselines


def _estimate(
    name: str,
    trajectories: Sequence[Trajectory],
    baselines: Mapping[Key, float],
    decay: float,
    key: KeyFn,
    state_prior: float | None,
    valid_turn_bonus: float,
) -> tuple[Advantages, dict[Key, float]]:
    if name == "rae":
        return rae(trajectories, baselines, decay=decay, key=key, state_prior=state_prior)
    stateless: dict[str, Callable[[], Advantages]] = {
        "turn_level": lambda: turn_level_returns(trajectories, key=key, valid_turn_bonus=valid_turn_bonus),
        "grpo": lambda: grpo(trajectories, key=key),
        "dr_grpo": lambda: grpo(trajectories, key=key, scale=False),
        "rloo": lambda: rloo(trajectories, key=key),
        "trr++": lambda: trr_plus_plus(trajectories, key=key),
        "reinforce": lambda: reinforce(trajectories),
    }
    if name not in stateless:
        raise UserError(f"unknown advantage estimator {name!r}; choose one of: {', '.join(ESTIMATORS)}")
    return stateless[name](), dict(baselines)


def advantage_stats(advantages: Advantages) -> dict[str, float]:
    """Mean, std, min, max and fraction of exact zeros over all turns, for logging."""
    flat = np.asarray([a for row in advantages for a in row], dtype=np.float64)
    if flat.size == 0:
        return {"mean": 0.0, "std": 0.0, "min": 0.0, "max": 0.0, "zero_fraction": 0.0}
    return {
        "mean": float(flat.mean()),
        "std": float(flat.std()),
        "min": float(flat.min()),
        "max": float(flat.max()),
        "zero_fraction": float(np.mean(flat == 0.0)),
    }
