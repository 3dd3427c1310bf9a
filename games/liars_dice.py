"""Liar's Dice, on OpenSpiel's `liars_dice`, with bids written as quantity x face."""

from __future__ import annotations

import re

from selfplay.games.answers import normalize
from selfplay.games.openspiel_game import OpenSpielGame

_LIAR_WORDS = {"liar", "call liar", "i call liar", "challenge", "call", "bluff", "call bluff", "call the bluff"}
_BID = re.compile(r"^(?:bid )?(\d+) ?(?:x|\*|-|,|:|/| |of) ?(\d+)(?:'?s)?$")


class LiarsDice(OpenSpielGame):
    """Liar's Dice: bid on the hidden dice of both players, or call the last bid a lie.

    Keyword parameters go to OpenSpiel: `numdice` (dice per player, 1 by default),
    `dice_sides` (6) and `bidding_rule` ("reset-face" or "reset-quantity").
    """

    def __init__(self, **params):
        super().__init__("liars_dice", **params)

    @property
    def _dice_per_player(self) -> int:
        return self.spiel_game.get_parameters()["numdice"]

    @property
    def _sides(self) -> int:
        return self.spiel_game.get_parameters()["dice_sides"]

    @property
    def _liar(self) -> int:
        return self.spiel_game.num_distinct_actions() - 1

    def rules_text(self) -> str:
        n, sides = self._dice_per_player, self._sides
        total = 2 * n
        dice = "die" if n == 1 else "dice"
        if self.spiel_game.get_parameters()["bidding_rule"] == "reset-face":
            higher = "a larger quantity, or the same quantity with a higher face"
        else:
            higher = "a higher face, or the same face with a larger quantity"
        example_quantity, example_face = min(2, total), max(1, sides - 1)
        return (
            f"You are playing Liar's Dice. Each player secretly rolls {n} {dice} with faces 1 to "
            f"{sides}; you see only your own. Players take turns, player_0 first. On your turn "
            f"you either make a bid or call 'liar'. A bid QxF claims that at least Q of all "
            f"{total} dice (yours and your opponent's together) show face F; for example "
            f"{example_quantity}x{example_face} claims at least {example_quantity} dice showing "
            f"{example_face}. Face {sides} is wild: a die showing {sides} counts as every face. "
            f"Each bid must be higher than the previous one: {higher}. Instead of bidding you may "
            f"call 'liar' on the last bid; then all dice are revealed and counted: if at least Q "
            f"dice show F (counting wild {sides}s), the bidder wins, otherwise the caller wins. The "
            f"winner gets reward 1 and the loser -1. Your move is a bid such as "
            f"{example_quantity}x{example_face}, or liar."
        )

    def _dice(self, player: int) -> list[int]:
        n = self._dice_per_player
        return sorted(action + 1 for action in self.state.history()[player * n : (player + 1) * n])

    def _bids(self) -> list[int]:
        return self.state.history()[2 * self._dice_per_player :]

    def _bid(self, action: int) -> tuple[int, int]:
        quantity, face = self.state.action_to_string(0, action).split("-")
        return int(quantity), int(face)

    def move_name(self, action: int) -> str:
        if action == self._liar:
            return "liar"
        return "{}x{}".format(*self._bid(action))

    def parse_move(self, answer: str) -> str | None:
        wanted = normalize(answer)
        if wanted in _LIAR_WORDS:
            move = "liar"
        else:
            match = _BID.match(wanted)
            if match is None:
                return None
            move = f"{int(match[1])}x{int(match[2])}"
        return move if move in self.legal_moves() else None

    def _matches(self, face: int) -> int:
        return sum(d in (face, self._sides) for p in range(2) for d in self._dice(p))

    def describe(self, player: int) -> str:
        sides, n = self._sides, self._dice_per_player
        mine = " ".join(str(d) for d in self._dice(player))
        lines = [
            f"Your {'die' if n == 1 else 'dice'}: {mine}. player_{1 - player} has {n} hidden "
            f"{'die' if n == 1 else 'dice'}; face {sides} is wild."
        ]
        bids = self._bids()
        said = []
        for i, action in enumerate(bids):
            if action == self._liar:
                said.append(f"player_{i % 2} called liar")
            else:
                said.append(f"player_{i % 2} bid {self.move_name(action)}")
        lines.append("Bids so far: " + (", ".join(said) if said else "none") + ".")
        last_bid = next((i for i in range(len(bids) - 1, -1, -1) if bids[i] != self._liar), None)
        if last_bid is None:
            lines.append("Current bid: none yet; player_0 opens the bidding.")
            return "\n".join(lines)
        quantity, face = self._bid(bids[last_bid])
        lines.append(
            f"Current bid: {quantity}x{face} by player_{last_bid % 2}, claiming at least "
            f"{quantity} of the {2 * n} dice show {face}" + (f" or the wild {sides}." if face != sides else ".")
        )
        if self.state.is_terminal():
            revealed = "; ".join(f"player_{p} had {' '.join(map(str, self._dice(p)))}" for p in range(2))
            winner = 0 if self.state.returns()[0] > 0 else 1
            matches = self._matches(face)
            lines.append(
                f"Dice revealed: {revealed}. {matches} {'die counts' if matches == 1 else 'dice count'} "
                f"as {face}, so player_{winner} wins."
            )
        return "\n".join(lines)
