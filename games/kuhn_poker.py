"""Kuhn Poker, on OpenSpiel's `kuhn_poker`, with poker words for its two actions."""

from __future__ import annotations

from selfplay.games.openspiel_game import OpenSpielGame

_CARDS = ("J", "Q", "K")
_PASS, _BET = 0, 1


class KuhnPoker(OpenSpielGame):
    """Kuhn Poker: three cards, one betting round, ante 1 chip, bets of 1 chip."""

    def __init__(self):
        super().__init__("kuhn_poker")

    def rules_text(self) -> str:
        return (
            "You are playing Kuhn Poker. The deck has three cards: J < Q < K. Each player antes "
            "1 chip and is dealt one private card; the third card is not used. player_0 acts "
            "first. With no bet pending you may 'check' or 'bet' 1 chip; facing a bet you may "
            "'call' (add 1 chip) or 'fold' (give up the pot). If both check, or a bet is called, "
            "the higher card wins the pot. Your reward is the number of chips you win or lose."
        )

    def _betting(self) -> list[int]:
        return self.state.history()[2:]

    def _facing_bet(self) -> bool:
        betting = self._betting()
        return bool(betting) and betting[-1] == _BET

    def move_name(self, action: int) -> str:
        if self._facing_bet():
            return "call" if action == _BET else "fold"
        return "bet" if action == _BET else "check"

    def describe(self, player: int) -> str:
        betting = self._betting()
        words, facing_bet = [], False
        for i, action in enumerate(betting):
            actor = f"player_{i % 2}"
            if facing_bet:
                words.append(f"{actor} {'called' if action == _BET else 'folded'}")
            else:
                words.append(f"{actor} {'bet' if action == _BET else 'checked'}")
                facing_bet = action == _BET
        lines = [
            f"Your card: {_CARDS[self.state.history()[player]]}.",
            "Betting so far: " + (", ".join(words) if words else "none") + ".",
            f"Pot: {2 + sum(betting)} chips.",
        ]
        folded = betting[-2:] == [_BET, _PASS]
        if self.state.is_terminal() and not folded:
            cards = ", ".join(f"player_{p} held {_CARDS[c]}" for p, c in enumerate(self.state.history()[:2]))
            lines.append(f"Showdown: {cards}.")
        return "\n".join(lines)
