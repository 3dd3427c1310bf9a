"""The records that flow between the parts of selfplay. Plain data, so that rollout
workers, the learner and the league can exchange them across processes."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class MatchResult:
    """One finished game: who sat where and how it ended."""

    game: str
    seed: int
    players: tuple[str, ...]  # agent label per seat
    rewards: tuple[float, ...]  # final reward per seat
    invalid_moves: tuple[int, ...]  # invalid outputs per seat
    turns: int  # valid moves played
    end_reason: str  # "game_over", "invalid_move" or "turn_cap"

    def to_dict(self) -> dict:
        return asdict(self)
