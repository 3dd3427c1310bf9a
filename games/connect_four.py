"""Connect Four, on OpenSpiel's `connect_four`, with columns numbered 0 to 6."""

from __future__ import annotations

import re

from selfplay.games.answers import normalize
from selfplay.games.openspiel_game import OpenSpielGame

_MARKS = ("X", "O")
_COLUMN = re.compile(r"^(?:col(?:umn)?\.?\s*)?(\d+)$")


class ConnectFour(OpenSpielGame):
    """Connect Four: drop discs into a 6x7 grid; four in a row wins."""

    def __init__(self):
        super().__init__("connect_four")

    def rules_text(self) -> str:
        return (
            "You are playing Connect Four. The board is a vertical grid of 6 rows and 7 columns, "
            "numbered 0 to 6 from left to right. player_0 plays X and moves first, player_1 plays "
            "O. On your turn you drop one disc into a column that is not full; it falls to the "
            "lowest empty cell of that column. The first to line up four of their discs in a row "
            "(horizontally, vertically or diagonally) wins; a full board with no such line is a "
            "draw. Your move is the number of a column."
        )

    def move_name(self, action: int) -> str:
        return str(action)

    def parse_move(self, answer: str) -> str | None:
        match = _COLUMN.match(normalize(answer))
        if match is None:
            return None
        column = str(int(match[1]))
        return column if column in self.legal_moves() else None

    def describe(self, player: int) -> str:
        rows = self.state.observation_string(player).split()
        grid = "\n".join(" ".join(cell.upper() for cell in row) for row in rows)
        numbers = " ".join(str(c) for c in range(len(rows[0])))
        return (
            f"You play {_MARKS[player]}. The board (top row first, '.' is empty, column numbers "
            f"below):\n{grid}\n{numbers}"
        )
