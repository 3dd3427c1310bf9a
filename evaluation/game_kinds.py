"""How evaluation judges play in each kind of game, from what the game declares
(`TextGame.zero_sum`, `cooperative`, `judged_by_return` and `big_blind`; OpenSpiel games derive
them from their game type).

- `win_loss`: a zero-sum game whose returns only say who won (TicTacToe, Connect Four, Nim).
  The primary figure is the rate of wins, draws and losses.
- `payoff`: a zero-sum game whose returns are amounts won, spread by luck (poker, dice): a hand
  played well can lose, and a policy is judged by what it wins on average. The primary figure
  is the mean return per game; poker games also give it in milli-big-blinds per hand.
- `general_sum`: a game that is not zero-sum (auctions, bargaining): both sides can gain, and
  nobody wins. The primary figure is each side's own mean return.
- `cooperative`: every seat gets the same return (Hanabi): one team score, which nobody wins
  against the others. The primary figure is the mean return, the team's score. A one-seat game
  (arithmetic) is a team of one.

In every kind, a game stopped by a turn cap (`game_outcome`: truncated) counts with its returns
in mean returns, and is neither a win, a draw nor a loss.
"""

from __future__ import annotations

from dataclasses import dataclass

from selfplay.games.base import TextGame

WIN_LOSS = "win_loss"
PAYOFF = "payoff"
GENERAL_SUM = "general_sum"
COOPERATIVE = "cooperative"
# A game's score in a win-lose game by its outcome (`game_outcome`); a truncated game has none.
OUTCOME_SCORES = {"wins": 1.0, "draws": 0.5, "losses": 0.0}


@dataclass(frozen=True)
class GameKind:
    name: str  # WIN_LOSS, PAYOFF, GENERAL_SUM or COOPERATIVE
    big_blind: float | None = None  # poker games: chips in one big blind

    @classmethod
    def of(cls, game: TextGame) -> GameKind:
        if game.cooperative or game.num_players == 1:  # a one-seat game is a team of one
            return cls(COOPERATIVE, game.big_blind)
        if not game.zero_sum:
            return cls(GENERAL_SUM, game.big_blind)
        return cls(PAYOFF if game.judged_by_return else WIN_LOSS, game.big_blind)

    @property
    def primary(self) -> str:
        """The primary figure's name, as the report heads it."""
        return "win / draw / loss" if self.name == WIN_LOSS else "mean return"

    @property
    def has_winners(self) -> bool:
        """Whether a game of this kind is won or lost against the other seats (zero-sum games);
        general-sum and cooperative games are judged by returns alone."""
        return self.name in (WIN_LOSS, PAYOFF)

    def score(self, mine: float, outcome: str) -> float | None:
        """What one game is worth to a player with return `mine` and `outcome` (`game_outcome`),
        in the unit that paired comparisons difference: 1, 1/2 or 0 for a win, draw or loss in a
        win-lose game (whose mean is the win rate plus half the draw rate), and None for a
        truncated one, which has no such score; the return itself otherwise."""
        if self.name != WIN_LOSS:
            return mine
        return OUTCOME_SCORES.get(outcome)


def mbb_per_hand(chips: float, big_blind: float) -> float:
    """Chips per hand in milli-big-blinds per hand (mbb/h), poker research's unit."""
    return 1000.0 * chips / big_blind


def primary_figures(row: dict) -> dict[str, float]:
    """The figures of a row of `outcome_stats` that judge play in its game's kind (by name):
    the win, draw and loss rates in a win-lose game; the mean return, and in poker its
    milli-big-blinds per hand, in a zero-sum payoff game; each side's mean return in a
    general-sum game; the mean return, the team's score, in a cooperative game."""
    if row["kind"]["name"] == WIN_LOSS:
        names = ("wins_rate", "draws_rate", "losses_rate")
    elif row["kind"]["name"] == PAYOFF:
        names = ("mean_return", "mbb_per_hand") if "mbb_per_hand" in row else ("mean_return",)
    elif row["kind"]["name"] == GENERAL_SUM:
        names = ("mean_return", "opponent_mean_return")
    else:
        names = ("mean_return",)
    return {name: row[name] for name in names}


def headline(row: dict) -> tuple[str, float, list[float] | None]:
    """The one figure that plots show for a row, its label and its 95% interval: the win rate
    in a win-lose game, the candidate's mean return otherwise."""
    if row["kind"]["name"] == WIN_LOSS:
        return "win rate", row["wins_rate"], row["wins_ci95"]
    return "mean return", row["mean_return"], row["mean_return_ci95"]
