"""The payoff table: how each player fares against each other, per game and role pairing.

Two records per ordered pair of players, each kept per (game, role pairing):

- win, draw and loss counts, decayed as AlphaStar's are: each new result between two players
  first multiplies all their counts by `decay`, whatever the game and seats of either, so the
  counts remember about 1 / (1 - decay) of the pair's latest results, and a player's win rate
  (wins plus half the draws, over games) follows the opponent it faces now rather than every
  version of it ever met. Matchmaking (PFSP), the snapshot rule and eviction read these.
- the returns, undecayed: every game counts once, with the sum and the sum of squares of the
  return (player a's reward less b's, halved: a's reward itself in a two-player zero-sum game),
  so that an entry carries an interval. `Returns.interval` is the 95% confidence interval for
  a's expected return against b that evaluation reports use (`significance.interval_of_mean`):
  mean +- t * sqrt(s^2 / n), Student's t quantile on n - 1 degrees of freedom and the unbiased
  sample variance s^2 of the n returns; none under two games or when every return agrees. The
  PSRO meta-game reads these; its members are frozen, so every game of theirs counts alike.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from selfplay.evaluation.significance import interval_of_mean
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

    def decay(self, factor: float) -> None:
        self.wins, self.draws, self.losses = factor * self.wins, factor * self.draws, factor * self.losses

    def add(self, outcome: float) -> None:
        """Count one result: 1 a win, 0.5 a draw, 0 a loss."""
        if outcome > 0.5:
            self.wins += 1
        elif outcome < 0.5:
            self.losses += 1
        else:
            self.draws += 1


@dataclass
class Returns:
    """Every return of one player against another, undecayed (see the module)."""

    games: int = 0
    total: float = 0.0
    squares: float = 0.0

    def add(self, value: float) -> None:
        self.games += 1
        self.total += value
        self.squares += value * value

    def merge(self, other: Returns) -> None:
        self.games += other.games
        self.total += other.total
        self.squares += other.squares

    @property
    def mean(self) -> float:
        return self.total / self.games if self.games else float("nan")

    @property
    def variance(self) -> float:
        """The unbiased sample variance; NaN under two games."""
        if self.games < 2:
            return float("nan")
        return max(0.0, (self.squares - self.total * self.mean) / (self.games - 1))

    @property
    def standard_error(self) -> float:
        return math.sqrt(self.variance / self.games) if self.games >= 2 else float("nan")

    def interval(self) -> list[float] | None:
        """The 95% confidence interval of the expected return (see the module)."""
        return interval_of_mean(self.games, self.mean, self.variance)


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
        # Per ordered pair of players, then per slot: a result decays every slot of its pair.
        self.tallies: dict[tuple[str, str], dict[Slot, Tally]] = defaultdict(lambda: defaultdict(Tally))
        self.returns: dict[tuple[str, str], dict[Slot, Returns]] = defaultdict(lambda: defaultdict(Returns))

    def add(self, match: LeagueMatch) -> None:
        for i, j, outcome in pairwise_outcomes(match):
            slot = (match.game, match.roles[i], match.roles[j])
            pair = match.players[i], match.players[j]
            tallies = self.tallies[pair]
            for tally in tallies.values():
                tally.decay(self.decay)
            tallies[slot].add(outcome)
            self.returns[pair][slot].add((match.rewards[i] - match.rewards[j]) / 2)

    def extend(self, matches: Iterable[LeagueMatch]) -> None:
        for match in matches:
            self.add(match)

    def forget(self, player: str) -> None:
        """Drop every result involving `player`."""
        for records in (self.tallies, self.returns):
            for pair in [pair for pair in records if player in pair]:
                del records[pair]

    def tally(self, a: str, b: str, game: str | None = None) -> Tally:
        """a's decayed results against b, summed over the role pairings (of `game`, or of all games)."""
        total = Tally()
        for (slot_game, _, _), found in self.tallies.get((a, b), {}).items():
            if game is None or slot_game == game:
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

    def pair_returns(self, a: str, b: str, game: str | None = None) -> Returns:
        """a's returns against b, pooled over the role pairings (of `game`, or of all games)."""
        total = Returns()
        for (slot_game, _, _), found in self.returns.get((a, b), {}).items():
            if game is None or slot_game == game:
                total.merge(found)
        return total

    def return_matrix(
        self, players: Sequence[str], game: str | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(mean returns, their standard errors, games) between `players`, row against column;
        NaN where they never met (standard errors: under two games), 0 on the diagonal."""
        means = np.zeros((len(players), len(players)))
        errors = np.zeros_like(means)
        games = np.zeros_like(means)
        for i, a in enumerate(players):
            for j, b in enumerate(players):
                if i != j:
                    returns = self.pair_returns(a, b, game)
                    means[i, j], errors[i, j], games[i, j] = returns.mean, returns.standard_error, returns.games
        return means, errors, games
