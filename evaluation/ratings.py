"""Elo ratings fitted from who beat whom, with OpenSpiel's implementation."""

from __future__ import annotations

from collections.abc import Sequence

import pyspiel


def fit_elo(wins: Sequence[Sequence[int]], draws: Sequence[Sequence[int]] | None = None) -> list[float]:
    """Elo ratings from a win matrix (`wins[i][j]`: games i won against j) and an optional
    symmetric draw matrix, by OpenSpiel's maximum-likelihood fit (`pyspiel.elo`). The weakest
    player is anchored at 0."""
    wins = [[int(x) for x in row] for row in wins]
    if draws is None:
        return list(pyspiel.elo.compute_ratings_from_matrices(wins))
    return list(pyspiel.elo.compute_ratings_from_matrices(wins, [[int(x) for x in row] for row in draws]))
