"""Online ratings, updated after every match: OpenSkill's Plackett-Luce model (Weng-Lin
Bayesian ratings, the openskill library), with each seat a team of one and seats ranked by
their rewards (equal rewards tie). Self-play games between the same player carry no rating
information and are skipped. A snapshot starts at its parent's rating, since at that moment
they are the same policy."""

from __future__ import annotations

from openskill.models import PlackettLuce

from selfplay.league.records import LeagueMatch


class OnlineRatings:
    def __init__(self):
        self.model = PlackettLuce()
        self.ratings = {}

    def _rating(self, name: str):
        if name not in self.ratings:
            self.ratings[name] = self.model.rating(name=name)
        return self.ratings[name]

    def add(self, match: LeagueMatch) -> None:
        if len(set(match.players)) < len(match.players):
            return
        teams = [[self._rating(name)] for name in match.players]
        # Plackett-Luce ranks: lower is better, equal ranks tie.
        order = sorted(set(match.rewards), reverse=True)
        ranks = [order.index(reward) for reward in match.rewards]
        for name, (rated,) in zip(match.players, self.model.rate(teams, ranks=ranks)):
            self.ratings[name] = rated

    def inherit(self, child: str, parent: str) -> None:
        parent_rating = self._rating(parent)
        self.ratings[child] = self.model.rating(mu=parent_rating.mu, sigma=parent_rating.sigma, name=child)

    def forget(self, name: str) -> None:
        """Back to the prior rating."""
        self.ratings.pop(name, None)

    def table(self) -> dict[str, tuple[float, float]]:
        """Player -> (mu, sigma)."""
        return {name: (r.mu, r.sigma) for name, r in self.ratings.items()}
