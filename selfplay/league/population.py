"""Who is in the population: when a learning player is frozen into a snapshot, and which
snapshot leaves when the population is full.

Snapshot rule (per learning player, checked after every step): freeze it when
`snapshot_every` steps have passed since its last snapshot (or reset), or when its win rate
against every player it is matched against exceeds `snapshot_win_rate` (each having met it
in at least `snapshot_min_games` decayed games), and in any case after `snapshot_max_steps`
steps. Exploiters restart from their initial weights after each snapshot (AlphaStar).

Eviction rule: when more than `population_cap` snapshots are active, the one the main player
beats most often leaves (the one PFSP would pick least, and the one it learns least from);
the newest snapshot of each learning player and the main player's snapshots that exploiters hunt
never leave, and ties go to the oldest. A retired snapshot keeps its
matches and ratings in the store; it is only no longer matched.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence

from selfplay.league.records import LeaguePlayer


def snapshot_name(learner: str, step: int) -> str:
    return f"{learner}@{step:06d}"


def snapshot_due(
    steps_since: int,
    win_rates: Sequence[tuple[float, float]],
    *,
    every: int,
    win_rate: float,
    min_games: float,
    max_steps: int,
) -> bool:
    """Whether a learning player should be frozen now. `win_rates` holds its (win rate, decayed
    games) against each player in its pool; `every`, `win_rate` and `max_steps` of 0 are off."""
    if steps_since < 1:
        return False
    if every and steps_since >= every:
        return True
    if max_steps and steps_since >= max_steps:
        return True
    return bool(win_rate and win_rates and all(games >= min_games and rate > win_rate for rate, games in win_rates))


def eviction_choice(
    snapshots: Sequence[LeaguePlayer], main_win_rate: Callable[[str], float], cap: int, hunted: Collection[str] = ()
) -> list[str]:
    """The snapshots to retire so that at most `cap` stay active (see the module's rule).
    `snapshots` are the active ones, oldest first; `main_win_rate(name)` is NaN if never met;
    `hunted` are the snapshots exploiters are training against."""
    active = list(snapshots)
    newest = {p.parent: p.name for p in active}
    retired = []
    while cap and len(active) > cap:
        candidates = [p for p in active if newest[p.parent] != p.name and p.name not in hunted]
        if not candidates:
            break
        rates = [main_win_rate(p.name) for p in candidates]
        rates = [0.5 if math.isnan(r) else r for r in rates]
        worst = max(range(len(candidates)), key=lambda i: (rates[i], -i))
        retired.append(candidates[worst].name)
        active.remove(candidates[worst])
    return retired
