"""Leduc Hold'em, on OpenSpiel's `leduc_poker`, with poker words for its three actions."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pyspiel

from selfplay.games.answers import normalize
from selfplay.games.openspiel_game import OpenSpielGame

# OpenSpiel's card ids 0..5 are J, J, Q, Q, K, K: the rank is id // 2, the suit never matters.
_RANKS = ("J", "Q", "K")
_FOLD, _CALL = 0, 1  # and 2 is raise
_RAISE_SIZES = (2, 4)
_MAX_RAISES = 2
_ANSWER = re.compile(r"^(fold|check|call|raise|bet)(?: (?:by )?(\d+)(?: chips?)?)?$")


def _rank(card: int) -> str:
    return _RANKS[card // 2]


@dataclass
class _Betting:
    """The betting so far, replayed from OpenSpiel's history."""

    rounds: list[list[str]] = field(default_factory=lambda: [[]])
    contributions: list[int] = field(default_factory=lambda: [1, 1])
    raises: int = 0
    folder: int | None = None

    def owed(self, player: int) -> int:
        return max(self.contributions) - self.contributions[player]

    def raise_size(self) -> int:
        return _RAISE_SIZES[len(self.rounds) - 1]


class LeducHoldem(OpenSpielGame):
    """Leduc Hold'em: six cards, one private and one public card, two betting rounds."""

    def __init__(self):
        super().__init__("leduc_poker")

    def rules_text(self) -> str:
        return (
            "You are playing Leduc Hold'em, a small poker game. The deck has six cards: two "
            "Jacks, two Queens and two Kings (J < Q < K; suits do not matter). Each player antes "
            "1 chip into the pot and is dealt one private card. There are two betting rounds; "
            "after the first, one public card is turned face up for both players. player_0 acts "
            "first in each round. With nothing to call you may 'check' or 'raise'; facing a raise "
            "you may 'fold' (give up the pot), 'call' (match it) or 'raise'. A raise puts in what "
            "is needed to call plus 2 chips in round 1, or plus 4 chips in round 2; at most 2 "
            "raises are allowed per round. A round ends when a raise is called or both players "
            "check. If nobody folds, the showdown decides: a player whose private card pairs the public "
            "card wins; otherwise the higher private card wins; equal ranks split the pot. Your "
            "reward is the number of chips you win or lose."
        )

    def _betting(self) -> _Betting:
        betting = _Betting()
        for step in self.state.full_history()[2:]:
            if step.player == pyspiel.PlayerId.CHANCE:
                betting.rounds.append([])
                betting.raises = 0
                continue
            owed = betting.owed(step.player)
            if step.action == _FOLD:
                betting.folder = step.player
                words = "folded"
            elif step.action == _CALL:
                betting.contributions[step.player] += owed
                words = f"called {owed}" if owed else "checked"
            else:
                size = betting.raise_size()
                betting.contributions[step.player] += owed + size
                betting.raises += 1
                words = f"raised by {size}"
            betting.rounds[-1].append(f"player_{step.player} {words}")
        return betting

    def move_name(self, action: int) -> str:
        if action == _FOLD:
            return "fold"
        if action == _CALL:
            return "call" if self._betting().owed(self.current_player()) else "check"
        return "raise"

    def parse_move(self, answer: str) -> str | None:
        match = _ANSWER.match(normalize(answer))
        if match is None:
            return None
        word, amount = match[1], match[2]
        betting = self._betting()
        owed = betting.owed(self.current_player())
        if word in ("check", "bet") and owed:
            return None
        move = {"fold": "fold", "check": "check", "call": self.move_name(_CALL)}.get(word, "raise")
        cost = {"call": owed, "raise": betting.raise_size(), "bet": betting.raise_size()}.get(word, 0)
        if amount is not None and int(amount) != cost:
            return None
        return move if move in self.legal_moves() else None

    def describe(self, player: int) -> str:
        history = self.state.history()
        betting = self._betting()
        round_number = len(betting.rounds)
        public = history[2 + len(betting.rounds[0])] if round_number == 2 else None
        lines = [f"Your private card: {_rank(history[player])}."]
        if public is None:
            lines.append("Public card: not dealt yet (it is turned up after round 1).")
        else:
            lines.append(f"Public card: {_rank(public)}.")
        lines.append(
            f"Round {round_number} of 2: a raise adds {betting.raise_size()} chips to the call; "
            f"{betting.raises} of {_MAX_RAISES} raises made this round."
        )
        paid = ", ".join(f"player_{p} put in {c}" for p, c in enumerate(betting.contributions))
        lines.append(f"Pot: {sum(betting.contributions)} chips ({paid}).")
        for number, actions in enumerate(betting.rounds, start=1):
            lines.append(f"Round {number} betting: " + (", ".join(actions) if actions else "none yet") + ".")
        if not self.state.is_terminal():
            owed = betting.owed(player)
            if player == self.current_player() and owed:
                lines.append(f"To call you must put in {owed} more chips.")
        elif betting.folder is not None:
            lines.append(f"player_{betting.folder} folded: player_{1 - betting.folder} wins the pot.")
        else:
            lines.append(self._showdown(public))
        return "\n".join(lines)

    def _showdown(self, public: int) -> str:
        hands = []
        for p in range(2):
            card = self.state.history()[p]
            strength = "a pair" if card // 2 == public // 2 else "high card"
            hands.append(f"player_{p} held {_rank(card)} ({strength})")
        returns = self.state.returns()
        if returns[0] == returns[1]:
            result = "the pot is split"
        else:
            result = f"player_{0 if returns[0] > 0 else 1} wins the pot"
        return f"Showdown: {', '.join(hands)}: {result}."
