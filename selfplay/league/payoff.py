"""The payoff table: how each player fares against each other, per game and role pairing.

Counts decay as AlphaStar's do: each new result between two players first multiplies their
counts by `decay`, so a player's win rate follows the opponent it faces now rather than every
version of it ever met. A score is wins plus half the draws over games.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from selfplay.league.records import LeagueMatch

# (game, role of the first player, role of the second)
Slot = tuple[str, str, str]


@dataclass
class Tally:
    wins: float = 0.0
    draws: float = 0.0
    losses: float = 0.0

    @property
    def games(self) -> float:
        return self.wins + self.draws + self.losses

    def add(self, outcome: float, decay: float) -> None:
        """Decay the counts, then count one result: 1 a win, 0.5 a draw, 0 a loss."""
        self.wins, self.draws, self.losses = decay * self.wins, decay * self.draws, decay * self.losses
        if outcome > 0.5:
            self.wins += 1
        elif outcome < 0.5:
            self.losses += 1
        else:
            self.draws += 1


def pairwise_outcomes(match: LeagueMatch) -> Iterable[tuple[int, int, float]]:
    """(seat i, seat j, outcome of i against j) for every ordered pair of seats held by different
    players: 1 if i's reward is higher, 0 if lower, 0.5 if equal."""
    for i, a in enumerate(match.players):
        for j, b in enumerate(match.players):
            if a != b:
                ri, rj = match.rewards[i], match.rewards[j]
                yield i, j, 1.0 if ri > rj else 0.0 if ri < rj else 0.5


class PayoffTable:
    def __init__(self, decay: float = 1.0):
        self.decay = decay
        self.tallies: dict[Slot, dict[tuple[str, str], Tally]] = defaultdict(lambda: defaultdict(Tally))

    def add(self, match: LeagueMatch) -> None:
        for i, j, outcome in pairwise_outcomes(match):
            slot = (match.game, match.roles[i], match.roles[j])
            self.tallies[slot][match.players[i], match.players[j]].add(outcome, self.decay)

    def extend(self, matches: Iterable[LeagueMatch]) -> None:
        for match in matches:
            self.add(match)

    def forget(self, player: str) -> None:
        """Drop every result involving `player`."""
        for pairs in self.tallies.values():
            for pair in [pair for pair in pairs if player in pair]:
                del pairs[pair]

    def tally(self, a: str, b: str, game: str | None = None) -> Tally:
        """a's decayed results against b, summed over the role pairings (of `game`, or of all games)."""
        total = Tally()
        for (slot_game, _, _), pairs in self.tallies.items():
            if game is None or slot_game == game:
                found = pairs.get((a, b))
                if found is not None:
                    total.wins += found.wins
                    total.draws += found.draws
                    total.losses += found.losses
        return total

    def win_rate(self, a: str, b: str, game: str | None = None) -> float:
        """a's score against b in [0, 1], draws counting half; NaN if they never met."""
        tally = self.tally(a, b, game)
        return (tally.wins + 0.5 * tally.draws) / tally.games if tally.games else float("nan")

    def matrix(self, players: Sequence[str], game: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(win rates, decayed game counts) between `players`, row against column; NaN where they
        never met, 0.5 on the diagonal."""
        rates = np.full((len(players), len(players)), np.nan)
        games = np.zeros((len(players), len(players)))
        for i, a in enumerate(players):
            rates[i, i] = 0.5
            for j, b in enumerate(players):
                if i != j:
                    games[i, j] = self.tally(a, b, game).games
                    rates[i, j] = self.win_rate(a, b, game)
        return rates, games
