"""Tic-tac-toe, on OpenSpiel's `tic_tac_toe`, with numbered cells."""

from __future__ import annotations

from selfplay.games.openspiel_game import OpenSpielGame

MARKS = ("X", "O")  # by seat


class TicTacToe(OpenSpielGame):
    """Tic-tac-toe: three in a row on a 3x3 board wins."""

    def __init__(self):
        super().__init__("tic_tac_toe")

    def rules_text(self) -> str:
        return (
            "You are playing Tic-tac-toe. Two players take turns marking an empty cell of a 3x3 "
            "board: player_0 plays X and moves first, player_1 plays O. The first to get three "
            "marks in a row (horizontally, vertically or diagonally) wins; a full board with no "
            "line is a draw. Cells are numbered 0 to 8, left to right and top to bottom. Your "
            "move is the number of an empty cell."
        )

    def move_name(self, action: int) -> str:
        return str(action)

    def describe(self, player: int) -> str:
        # One character per cell, so that a tokenizer that splits digits (as the default
        # model's, Qwen's and Llama's do) reads every cell as one token at the same place on
        # every board: a model finds cell k where it found it the move before.
        shown = shown_cells(self.state.observation_string(player).replace("\n", ""))
        board = "\n".join("|".join(shown[r * 3 : r * 3 + 3]) for r in range(3))
        return f"You play {MARKS[player]}. The board (empty cells show their number):\n{board}"


def shown_cells(cells: str) -> list[str]:
    """OpenSpiel's nine cells (`x`, `o`, `.`) as the prompt shows them: a mark in capitals, an
    empty cell as its number."""
    return [str(i) if c == "." else c.upper() for i, c in enumerate(cells)]
