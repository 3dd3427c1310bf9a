"""The PSRO meta-game of a league: which past players it holds, and the games that fill it.

The meta-game of one game is a symmetric zero-sum matrix game between the league's past
players (active snapshots and scripted agents): entry [i][j] is i's mean return against j
(`PayoffTable.return_matrix`; (M - M^T) / 2, so it stays zero-sum where the game is not).
A past player joins it only once it has played `min_games` games against each member before
it (oldest first): until then its entries carry too wide an interval to be trusted, and the
league schedules evaluation games that fill them (`evaluation_matches`). Those games are
played by the frozen players themselves, with no learner training on them, each deal twice
with the seats swapped, so that the luck of the deal cancels out of each pair of games (which
makes the payoff table's independent-games interval conservative).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from selfplay.evaluation.meta_solvers import solve
from selfplay.rollouts import MatchSpec


def members(games: np.ndarray, min_games: int) -> list[int]:
    """The indices of the past players in the meta-game: `games[i][j]` is how many games i and j
    played, the players oldest first; each joins if it played `min_games` against every member
    before it (the first always joins)."""
    joined: list[int] = []
    for index in range(len(games)):
        if all(games[index, member] >= min_games for member in joined):
            joined.append(index)
    return joined


def antisymmetric(means: np.ndarray) -> np.ndarray:
    """The zero-sum meta-game of mean returns means[i][j] (see the module)."""
    return (means - means.T) / 2


def solve_meta_game(solver: str, means: np.ndarray, games: np.ndarray, min_games: int) -> np.ndarray:
    """The weight `solver` (a key of `meta_solvers.SOLVERS`) gives each past player in the meta-game
    of mean returns `means` and game counts `games` between them, 0 for those not yet members."""
    joined = members(games, min_games)
    weights = np.zeros(len(means))
    weights[joined] = solve(solver, antisymmetric(means[np.ix_(joined, joined)]))
    return weights


def evaluation_matches(
    rng: np.random.Generator, game: str, players: Sequence[str], games: np.ndarray, min_games: int
) -> list[MatchSpec]:
    """The games that bring every pair of `players` to `min_games` games in the two-seat `game`
    (`games[i][j]`: how many they have played), in deals played twice with the seats swapped
    (an odd shortfall rounds up), owned by no learner."""
    matches = []
    for i, first in enumerate(players):
        for j in range(i + 1, len(players)):
            shortfall = min_games - int(games[i, j])
            for _ in range((shortfall + 1) // 2 if shortfall > 0 else 0):
                seed = int(rng.integers(2**31))
                matches += [MatchSpec(game, (first, players[j]), seed), MatchSpec(game, (players[j], first), seed)]
    return matches
