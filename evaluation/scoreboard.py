"""Per-agent tallies of finished games: wins, draws, losses, truncated games, invalid moves and
reward (their intervals: `significance`)."""

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
    beats it, "draws" otherwise (alone at the table, too)."""
    mine = rewards[seat]
    best_other = max((r for s, r in enumerate(rewards) if s != seat), default=mine)
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
