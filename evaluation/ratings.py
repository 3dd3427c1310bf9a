"""Elo ratings fitted from who beat whom, with OpenSpiel's implementation, and their intervals."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pyspiel
from scipy.optimize import brentq

from selfplay.evaluation.significance import wilson_interval

# Fewer decided games than this for a player and its Elo interval spans more than about +-120
# points (a 50% score over 30 games: Wilson interval 0.33-0.67): too wide to rank checkpoints.
MIN_ELO_GAMES = 30


def fit_elo(wins: Sequence[Sequence[int]], draws: Sequence[Sequence[int]] | None = None) -> list[float]:
    """Elo ratings from a win matrix (`wins[i][j]`: games i won against j) and an optional
    symmetric draw matrix, by OpenSpiel's maximum-likelihood fit (`pyspiel.elo`). The weakest
    player is anchored at 0."""
    wins = [[int(x) for x in row] for row in wins]
    if draws is None:
        return list(pyspiel.elo.compute_ratings_from_matrices(wins))
    return list(pyspiel.elo.compute_ratings_from_matrices(wins, [[int(x) for x in row] for row in draws]))


def _expected_score(difference: float) -> float:
    return 1.0 / (1.0 + 10.0 ** (-difference / 400.0))


def decided_games(wins: Sequence[Sequence[int]], draws: Sequence[Sequence[int]]) -> np.ndarray:
    """`[i][j]`: the games between i and j that were won, lost or drawn (the ones Elo is fitted to)."""
    won = np.asarray(wins, dtype=float)
    return won + won.T + np.asarray(draws, dtype=float)


def elo_intervals(
    ratings: Sequence[float], wins: Sequence[Sequence[int]], draws: Sequence[Sequence[int]]
) -> list[list[float | None]]:
    """Each player's 95% Elo interval, holding the others' ratings fixed: the ratings at which its
    expected score over the games it played (draws half) would be either end of the Wilson
    interval of the score it made. An end that a perfect score or a whole loss leaves unbounded
    is None, as are both ends for a player with no decided game. With two players, 8 wins and 2
    losses are 240 Elo in [-7, +488]."""
    played = decided_games(wins, draws)
    intervals: list[list[float | None]] = []
    for i, games in enumerate(played):
        opponents = [(n, ratings[j]) for j, n in enumerate(games) if n]
        score = float(np.sum(wins[i])) + float(np.sum(draws[i])) / 2
        bounds = wilson_interval(score, int(games.sum())) if opponents else (0.0, 1.0)
        intervals.append([_rating_at(bound, opponents) for bound in bounds])
    return intervals


def _rating_at(share: float, opponents: list[tuple[float, float]]) -> float | None:
    """The rating whose expected score against `opponents` ((games, rating) each) is `share`;
    None at a share of 0 or 1, which no finite rating reaches."""
    if share <= 0.0 or share >= 1.0:
        return None
    total = sum(n for n, _ in opponents)

    def shortfall(rating: float) -> float:
        return sum(n * _expected_score(rating - other) for n, other in opponents) / total - share

    # Against opponents all rated r, the score is `share` at r + `gap`: the root lies between the
    # lowest and the highest opponent's rating plus `gap`.
    gap = 400.0 * math.log10(share / (1 - share))
    ratings = [other for _, other in opponents]
    return float(brentq(shortfall, min(ratings) + gap - 1.0, max(ratings) + gap + 1.0))


def few_games_warning(
    players: Sequence[str], wins: Sequence[Sequence[int]], draws: Sequence[Sequence[int]], setting: str
) -> str | None:
    """A warning (no "warning:" before it) naming the players with fewer than `MIN_ELO_GAMES`
    decided games, whose Elo is too uncertain to rank them, and the `setting` that plays more;
    None if there are none."""
    counts = decided_games(wins, draws).sum(axis=1)
    few = [f"{name} ({count:.0f})" for name, count in zip(players, counts) if count < MIN_ELO_GAMES]
    if not few:
        return None
    return (
        f"Elo from fewer than {MIN_ELO_GAMES} decided games is too uncertain to rank by: "
        f"{', '.join(few)}; raise {setting} for more."
    )


def elo_text(rating: float, interval: Sequence[float | None]) -> str:
    """An Elo rating and its 95% interval, an unbounded end as inf: "240 [-7, +488]"."""
    low = "-inf" if interval[0] is None else f"{interval[0]:+.0f}"
    high = "inf" if interval[1] is None else f"{interval[1]:+.0f}"
    return f"{rating:.0f} [{low}, {high}]"
