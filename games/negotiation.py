"""Simple Negotiation, after SPIRAL: trade wood, stone and gold, valued privately.

Each player starts with some units of three resources and a private value per unit of each,
both drawn at reset. Players alternate for a fixed number of turns, player_0 first. On a turn
a player offers a trade ("offer 2 wood for 1 gold": give 2 wood, receive 1 gold), accepts the
opponent's pending offer (the trade happens at once), or passes, which declines it; a new
offer replaces the pending one. A player's gain is the value of their final inventory minus
the value of their initial inventory, both at their own values. The larger gain scores +1 and
the other player -1; equal gains score 0 each. The game is zero-sum even though a trade can
raise both gains: what counts is gaining more than the opponent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from selfplay.errors import UserError
from selfplay.games.answers import normalize
from selfplay.games.base import TextGame

RESOURCES = ("wood", "stone", "gold")
# Offers name at most this many units of a resource, which bounds the list of legal moves.
MAX_OFFER = 10
_NAMES = "|".join(RESOURCES)
_OFFER = re.compile(rf"(?:offer:? ?)?(\d+) ?({_NAMES})s? ?(?:for|->|=>|in exchange for) ?(\d+) ?({_NAMES})s?")
_REPLY = re.compile(r"(accept|pass|decline|reject)(?: the)?(?: offer)?")


@dataclass(frozen=True)
class Offer:
    """`player` proposes to give `give` units of `give_resource` and receive `get` units of `get_resource`."""

    player: int
    give: int
    give_resource: int
    get: int
    get_resource: int

    @property
    def move(self) -> str:
        return f"offer {self.give} {RESOURCES[self.give_resource]} for {self.get} {RESOURCES[self.get_resource]}"


class SimpleNegotiation(TextGame):
    """Simple Negotiation: trade wood, stone and gold at private values; the larger gain wins."""

    observation_shape = (14,)

    def __init__(
        self,
        rounds: int = 5,
        min_quantity: int = 3,
        max_quantity: int = 8,
        min_value: int = 1,
        max_value: int = 10,
    ):
        if rounds < 1 or not 0 <= min_quantity <= max_quantity or not 0 <= min_value <= max_value:
            raise UserError(
                "negotiation needs rounds >= 1, 0 <= min_quantity <= max_quantity and "
                f"0 <= min_value <= max_value; got rounds={rounds}, quantities {min_quantity}..{max_quantity}, "
                f"values {min_value}..{max_value}."
            )
        self.rounds = rounds
        self.turns = 2 * rounds
        self.quantities = (min_quantity, max_quantity)
        self.value_range = (min_value, max_value)
        self.rules = self.rules_text()
        self.reset(np.random.default_rng())

    def rules_text(self) -> str:
        return (
            "You are playing Simple Negotiation against one opponent. There are three resources: "
            "wood, stone and gold. Each player starts with between "
            f"{self.quantities[0]} and {self.quantities[1]} units of each resource and values each "
            f"unit of each resource privately, between {self.value_range[0]} and {self.value_range[1]}; "
            "you see your own values only, and both inventories. Players alternate turns, player_0 "
            f"first, for {self.turns} turns in all ({self.rounds} each). On your turn you may:\n"
            "- 'offer Q1 R1 for Q2 R2': propose to give Q1 units of resource R1 and receive Q2 units "
            "of a different resource R2. You must hold Q1 of R1 and the opponent must hold Q2 of R2 "
            f"(each at most {MAX_OFFER}). A new offer replaces any pending offer.\n"
            "- 'accept': accept the opponent's pending offer; the trade happens at once.\n"
            "- 'pass': do nothing, declining any pending offer.\n"
            "An offer can be accepted only on the opponent's next turn. When the turns run out, each "
            "player's gain is the value of their final inventory minus the value of their initial "
            "inventory, at their own values. The player with the larger gain wins (reward +1) and "
            "the other loses (-1); equal gains are a draw (0 each)."
        )

    # -- the state machine ---------------------------------------------------------------

    def reset(self, rng: np.random.Generator) -> None:
        low, high = self.quantities
        self.inventory: list[list[int]] = rng.integers(low, high + 1, size=(2, 3)).tolist()
        low, high = self.value_range
        self.values: list[list[int]] = rng.integers(low, high + 1, size=(2, 3)).tolist()
        # Gains come from the net traded amounts, so a test may set `inventory` directly.
        self.net = [[0, 0, 0], [0, 0, 0]]
        self.turn = 0
        self.pending: Offer | None = None
        self.history: list[str] = []

    def current_player(self) -> int:
        return self.turn % 2

    def _offer_limits(self, player: int) -> tuple[list[int], list[int]]:
        """How many units of each resource `player` may give, and may ask for, in one offer."""
        give = [min(q, MAX_OFFER) for q in self.inventory[player]]
        get = [min(q, MAX_OFFER) for q in self.inventory[1 - player]]
        return give, get

    def _offer_moves(self, player: int) -> list[str]:
        give_max, get_max = self._offer_limits(player)
        return [
            f"offer {give} {RESOURCES[r1]} for {get} {RESOURCES[r2]}"
            for r1 in range(3)
            for r2 in range(3)
            if r1 != r2
            for give in range(1, give_max[r1] + 1)
            for get in range(1, get_max[r2] + 1)
        ]

    def _is_legal_offer(self, offer: Offer) -> bool:
        give_max, get_max = self._offer_limits(offer.player)
        return (
            offer.give_resource != offer.get_resource
            and 1 <= offer.give <= give_max[offer.give_resource]
            and 1 <= offer.get <= get_max[offer.get_resource]
        )

    def _can_accept(self) -> bool:
        offer = self.pending
        return (
            offer is not None
            and offer.player != self.current_player()
            and self.inventory[offer.player][offer.give_resource] >= offer.give
            and self.inventory[1 - offer.player][offer.get_resource] >= offer.get
        )

    def legal_moves(self) -> list[str]:
        moves = self._offer_moves(self.current_player())
        if self._can_accept():
            moves.append("accept")
        moves.append("pass")
        return moves

    def parse_move(self, answer: str) -> str | None:
        text = normalize(answer)
        reply = _REPLY.fullmatch(text)
        if reply is not None:
            if reply[1] != "accept":
                return "pass"
            return "accept" if self._can_accept() else None
        offer = self._read_offer(text)
        return offer.move if offer is not None and self._is_legal_offer(offer) else None

    def _read_offer(self, text: str) -> Offer | None:
        match = _OFFER.fullmatch(text)
        if match is None:
            return None
        give, give_resource, get, get_resource = match.groups()
        return Offer(
            self.current_player(), int(give), RESOURCES.index(give_resource), int(get), RESOURCES.index(get_resource)
        )

    def apply(self, move: str) -> None:
        player = self.current_player()
        if move == "accept":
            offer = self.pending
            for p, sign in ((offer.player, 1), (1 - offer.player, -1)):
                for resource, amount in ((offer.give_resource, -offer.give), (offer.get_resource, offer.get)):
                    self.inventory[p][resource] += sign * amount
                    self.net[p][resource] += sign * amount
            self.history.append(
                f"player_{player} accepted: player_{offer.player} gave {_units(offer.give, offer.give_resource)} "
                f"and received {_units(offer.get, offer.get_resource)}."
            )
            self.pending = None
        elif move == "pass":
            declined = ", declining the offer" if self.pending is not None else ""
            self.history.append(f"player_{player} passed{declined}.")
            self.pending = None
        else:
            self.pending = self._read_offer(move)
            self.history.append(f"player_{player} offered {self.pending.move.removeprefix('offer ')}.")
        self.turn += 1

    def is_over(self) -> bool:
        return self.turn >= self.turns

    def gains(self) -> list[int]:
        """Each player's gain so far: the value of their net trades at their own values."""
        return [sum(v * n for v, n in zip(self.values[p], self.net[p])) for p in range(2)]

    def returns(self) -> list[float]:
        first, second = self.gains()
        if first == second:
            return [0.0, 0.0]
        return [1.0, -1.0] if first > second else [-1.0, 1.0]

    # -- what a player sees -----------------------------------------------------------------

    def _turns_left(self, player: int) -> int:
        return len(range(self.turn + (player - self.turn) % 2, self.turns, 2))

    def describe(self, player: int) -> str:
        opponent = 1 - player
        values = ", ".join(f"{name} {value}" for name, value in zip(RESOURCES, self.values[player]))
        worth = sum(v * q for v, q in zip(self.values[player], self.inventory[player]))
        offer = self.pending
        if offer is None:
            pending = "No offer is pending."
        elif offer.player == player:
            pending = f"Your offer of {offer.move.removeprefix('offer ')} is pending."
        else:
            pending = (
                f"Pending offer from player_{opponent}: they give you {_units(offer.give, offer.give_resource)} "
                f"in exchange for {_units(offer.get, offer.get_resource)} from you."
            )
        history = [f"{i}. {event}" for i, event in enumerate(self.history, 1)] or ["none yet"]
        return "\n".join(
            [
                f"Your inventory: {_goods(self.inventory[player])}.",
                f"Your values per unit (private): {values}. The opponent's values are hidden from you.",
                f"At your values your inventory is worth {worth}; your gain so far is {self.gains()[player]:+d}.",
                f"player_{opponent}'s inventory: {_goods(self.inventory[opponent])}.",
                pending,
                f"Turns left: {self.turns - self.turn} in all, {self._turns_left(player)} of them yours.",
                "History:",
                *history,
            ]
        )

    def moves_prompt(self) -> str:
        forms = []
        give_max, get_max = self._offer_limits(self.current_player())
        if any(give_max[r1] and get_max[r2] for r1 in range(3) for r2 in range(3) if r1 != r2):
            forms.append(
                "'offer Q1 R1 for Q2 R2' with R1 and R2 two different resources (wood, stone, gold), "
                f"Q1 from 1 to what you hold of R1 and Q2 from 1 to what the opponent holds of R2 (at most {MAX_OFFER})"
            )
        if self._can_accept():
            forms.append("'accept' (take the pending offer)")
        forms.append("'pass'")
        return "Your moves: " + "; ".join(forms) + "."

    def observation_tensor(self, player: int) -> np.ndarray:
        # The pending offer is encoded as the change it would make to `player`'s inventory, and
        # whose it is: +1 the opponent's (acceptable), -1 the player's own, 0 none.
        change, owner = np.zeros(3), 0.0
        if self.pending is not None:
            offer = self.pending
            change[offer.give_resource] -= offer.give
            change[offer.get_resource] += offer.get
            owner = -1.0 if offer.player == player else 1.0
            change *= -owner
        return np.concatenate(
            [
                self.inventory[player],
                self.values[player],
                self.inventory[1 - player],
                change,
                [owner, self.turns - self.turn],
            ]
        ).astype(np.float32)


def _units(quantity: int, resource: int) -> str:
    return f"{quantity} {RESOURCES[resource]}"


def _goods(quantities: list[int]) -> str:
    return ", ".join(f"{q} {name}" for q, name in zip(quantities, RESOURCES))
