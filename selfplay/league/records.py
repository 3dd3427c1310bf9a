"""The league's records: its players and every match they finished."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PlayerKind = Literal["main", "main_exploiter", "league_exploiter", "snapshot", "scripted"]
LEARNING_KINDS = ("main", "main_exploiter", "league_exploiter")


@dataclass(frozen=True)
class LeaguePlayer:
    """A member of the population. Learning players (`main`, the exploiters) train; snapshots
    are frozen copies of one of them; scripted players are agent specs such as "mcts:100"."""

    name: str  # unique: "main", "main@000040", "league_exploiter_0", "mcts:100"
    kind: PlayerKind
    created_step: int
    parent: str | None = None  # the learning player a snapshot froze
    weights: str | None = None  # a snapshot's safetensors file, relative to the run directory
    active: bool = True  # False once evicted: kept for the record, never matched again


@dataclass(frozen=True)
class LeagueMatch:
    """One finished game between league players."""

    step: int
    game: str
    seed: int
    players: tuple[str, ...]  # league player per seat
    roles: tuple[str, ...]  # the role each seat played, e.g. "player_0" or "solver"
    versions: tuple[int, ...]  # policy version per seat (a step); -1 for scripted agents
    rewards: tuple[float, ...]
    end_reason: str  # "game_over", "invalid_move" or "turn_cap"
