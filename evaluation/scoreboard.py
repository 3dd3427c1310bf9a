"""Per-agent tallies of finished games: wins, draws, losses, truncated games, invalid moves and
reward, and confidence intervals for rates and means."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from selfplay.records import MatchResult


@dataclass
class AgentRecord:
    agent: str
    games: int = 0
    wins: int = 0
    draws: int = 0
    losses: int = 0
    truncated: int = 0  # games stopped by a turn cap: neither won, drawn nor lost
    invalid_moves: int = 0
    total_reward: float = 0.0

    @property
    def mean_reward(self) -> float:
        return self.total_reward / self.games if self.games else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "mean_reward": self.mean_reward}


def seat_outcome(rewards: tuple[float, ...], seat: int) -> str:
    """ "wins" when the seat's reward beats every other seat's, "losses" when another seat's
    beats it, "draws" otherwise."""
    mine = rewards[seat]
    best_other = max(r for s, r in enumerate(rewards) if s != seat)
    return "wins" if mine > best_other else "losses" if mine < best_other else "draws"


def game_outcome(result: MatchResult, seat: int) -> str:
    """ "truncated" for a game stopped by a turn cap, else the seat's `seat_outcome`."""
    return "truncated" if result.end_reason == "turn_cap" else seat_outcome(result.rewards, seat)


# The share of truncated games above which a series says that its results are mostly unfinished games.
TRUNCATED_WARNING_SHARE = 0.1


def truncation_warning(truncated: int, games: int, setting: str) -> str | None:
    """One warning line when more than `TRUNCATED_WARNING_SHARE` of `games` were stopped by a
    turn cap, naming the `setting` that raises it; None otherwise."""
    if truncated <= TRUNCATED_WARNING_SHARE * games:
        return None
    return (
        f"warning: {truncated} of {games} games were stopped by a turn cap and are counted as truncated, "
        f"not as draws; raise {setting} to play them out."
    )


def tally(results: Iterable[MatchResult]) -> list[AgentRecord]:
    """One record per agent, in order of first appearance (outcomes by `game_outcome`)."""
    records: dict[str, AgentRecord] = {}
    for result in results:
        for seat, agent in enumerate(result.players):
            record = records.setdefault(agent, AgentRecord(agent))
            outcome = game_outcome(result, seat)
            record.games += 1
            setattr(record, outcome, getattr(record, outcome) + 1)
            record.invalid_moves += result.invalid_moves[seat]
            record.total_reward += result.rewards[seat]
    return list(records.values())


def format_table(records: Iterable[AgentRecord]) -> str:
    header = ("agent", "games", "wins", "draws", "losses", "truncated", "invalid", "mean reward")
    rows = [
        (
            r.agent,
            *map(str, (r.games, r.wins, r.draws, r.losses, r.truncated, r.invalid_moves)),
            f"{r.mean_reward:+.3f}",
        )
        for r in records
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join([row[0].ljust(widths[0]), *(cell.rjust(w) for cell, w in zip(row[1:], widths[1:]))])
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


Z_95 = 1.959963984540054  # the standard normal quantile of 0.975


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval for a binomial rate (95% by default). Unlike the normal
    approximation it stays inside [0, 1] and is not empty at 0 or `trials` successes."""
    if trials <= 0:
        return (0.0, 1.0)
    rate = successes / trials
    spread = z * z / trials
    centre = (rate + spread / 2) / (1 + spread)
    half = z * math.sqrt(rate * (1 - rate) / trials + spread / (4 * trials)) / (1 + spread)
    # Rounding can put a bound a hair past the rate at 0 or `trials` successes.
    return (max(0.0, min(rate, centre - half)), min(1.0, max(rate, centre + half)))


def mean_interval(values: Sequence[float], z: float = Z_95) -> tuple[float, list[float] | None]:
    """The mean of `values` and its 95% interval, mean +- z * s / sqrt(n) with the sample
    standard deviation s (the normal approximation: with the 50 to 100 games of a suite,
    Student's t would widen it by 1-3%). No interval (None) from fewer than two values."""
    n = len(values)
    mean = math.fsum(values) / n if n else 0.0
    if n < 2:
        return mean, None
    half = z * math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1) / n)
    return mean, [mean - half, mean + half]
