"""Per-agent tallies of finished games: wins, draws, losses, invalid moves and reward."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from selfplay.records import MatchResult


@dataclass
class AgentRecord:
    agent: str
    games: int = 0
    wins: int = 0
    draws: int = 0
    losses: int = 0
    invalid_moves: int = 0
    total_reward: float = 0.0

    @property
    def mean_reward(self) -> float:
        return self.total_reward / self.games if self.games else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "mean_reward": self.mean_reward}


def tally(results: Iterable[MatchResult]) -> list[AgentRecord]:
    """One record per agent, in order of first appearance.

    A seat wins when its reward beats every other seat's, loses when another seat's beats
    it, and draws otherwise.
    """
    records: dict[str, AgentRecord] = {}
    for result in results:
        for seat, agent in enumerate(result.players):
            record = records.setdefault(agent, AgentRecord(agent))
            mine = result.rewards[seat]
            best_other = max(r for s, r in enumerate(result.rewards) if s != seat)
            record.games += 1
            record.wins += mine > best_other
            record.losses += mine < best_other
            record.draws += mine == best_other
            record.invalid_moves += result.invalid_moves[seat]
            record.total_reward += mine
    return list(records.values())


def format_table(records: Iterable[AgentRecord]) -> str:
    header = ("agent", "games", "wins", "draws", "losses", "invalid", "mean reward")
    rows = [
        (r.agent, str(r.games), str(r.wins), str(r.draws), str(r.losses), str(r.invalid_moves), f"{r.mean_reward:+.3f}")
        for r in records
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join([row[0].ljust(widths[0]), *(cell.rjust(w) for cell, w in zip(row[1:], widths[1:]))])
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
