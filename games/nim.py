"""Nim, on OpenSpiel's `nim`, with moves named by pile and count."""

from __future__ import annotations

import re
from collections.abc import Sequence

from selfplay.errors import UserError
from selfplay.games.answers import normalize
from selfplay.games.openspiel_game import OpenSpielGame

_ACTION = re.compile(r"pile:(\d+), take:(\d+);")
_PAIR = re.compile(r"^(?:pile ?)?(\d+) ?[ ,:/-] ?(\d+)$")
_PILE = re.compile(r"pile ?[:#]? ?(\d+)")
_COUNT = re.compile(r"(?:take|remove)s? ?:? ?(\d+)|(\d+) (?:\w+ )?from")


class Nim(OpenSpielGame):
    """Nim: take objects from one pile at a time; by default whoever takes the last one loses.

    `pile_sizes` is a list of ints or OpenSpiel's "1;3;5;7" string (the default); `misere`
    (default True) makes taking the last object lose rather than win.
    """

    def __init__(self, pile_sizes: str | Sequence[int] | None = None, misere: bool = True):
        if not isinstance(misere, bool):
            raise UserError(f"nim: misere must be true or false, got {misere!r}.")
        params = {"is_misere": misere}
        if isinstance(pile_sizes, str):
            params["pile_sizes"] = pile_sizes
        elif pile_sizes is not None:
            if not all(isinstance(n, int) and not isinstance(n, bool) for n in pile_sizes):
                raise UserError(f"nim: pile_sizes must be whole numbers, got {pile_sizes!r}.")
            params["pile_sizes"] = ";".join(str(n) for n in pile_sizes)
        super().__init__("nim", **params)

    @property
    def _misere(self) -> bool:
        return self.spiel_game.get_parameters()["is_misere"]

    def _initial_piles(self) -> list[int]:
        return [int(n) for n in self.spiel_game.get_parameters()["pile_sizes"].split(";")]

    def _piles(self) -> list[int]:
        piles = self._initial_piles()
        for action in self.state.history():
            pile, count = self._pile_and_count(action)
            piles[pile - 1] -= count
        return piles

    def _pile_and_count(self, action: int) -> tuple[int, int]:
        pile, count = _ACTION.match(self.state.action_to_string(0, action)).groups()
        return int(pile), int(count)

    def _last_object_rule(self) -> str:
        return "whoever takes the last object loses" if self._misere else "whoever takes the last object wins"

    def rules_text(self) -> str:
        piles = self._initial_piles()
        sizes = ", ".join(str(n) for n in piles[:-1]) + (" and " if len(piles) > 1 else "") + str(piles[-1])
        return (
            f"You are playing Nim with {len(piles)} pile{'s' if len(piles) > 1 else ''} of "
            f"objects, numbered from 1, that hold {sizes} objects at the start. Players take "
            f"turns, player_0 first. On your turn you take one or more objects from a single pile "
            f"(up to all of it). {self._last_object_rule().capitalize()}"
            f"{' (misere Nim)' if self._misere else ''}. The winner gets reward 1 and the loser "
            f"-1. Write your move as 'pile P take N': for example 'pile 2 take 3' takes 3 objects "
            f"from pile 2."
        )

    def move_name(self, action: int) -> str:
        return "pile {} take {}".format(*self._pile_and_count(action))

    def parse_move(self, answer: str) -> str | None:
        wanted = normalize(answer)
        if len(re.findall(r"\d+", wanted)) != 2:
            return None
        pair = _PAIR.match(wanted)
        if pair is not None:
            pile, count = pair[1], pair[2]
        else:
            pile_match, count_match = _PILE.search(wanted), _COUNT.search(wanted)
            if pile_match is None or count_match is None:
                return None
            pile, count = pile_match[1], count_match[1] or count_match[2]
        move = f"pile {int(pile)} take {int(count)}"
        return move if move in self.legal_moves() else None

    def describe(self, player: int) -> str:
        piles = self._piles()
        lines = ["Piles:"]
        lines += [f"  pile {i}: {n} object{'' if n == 1 else 's'}" for i, n in enumerate(piles, start=1)]
        lines.append(f"Objects left: {sum(piles)}. Rule: {self._last_object_rule()}.")
        history = self.state.history()
        if history:
            pile, count = self._pile_and_count(history[-1])
            mover = (len(history) - 1) % 2
            lines.append(f"Last move: player_{mover} took {count} from pile {pile}.")
            if self.state.is_terminal():
                outcome = "loses" if self._misere else "wins"
                lines.append(f"player_{mover} took the last object and {outcome}.")
        return "\n".join(lines)
