"""Rules of OpenSpiel games as a model needs them: the objective, each seat's side, and how moves
are written.

`CATALOGUE` holds the games most used to evaluate language models, written from OpenSpiel's own
implementations (their move names and board strings). Every other game gets the same three parts
built from OpenSpiel's `GameType` and `GameInfo` (`fallback_objective`) and its move names.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyspiel


@dataclass(frozen=True)
class GameRules:
    objective: str
    moves: str  # how a move is written
    sides: tuple[str, ...] = ()  # what each seat plays, e.g. ("x, moving first", "o"); () says nothing more


_HEX_CELLS = (
    "a cell as column letter and row number: a1 is the top-left cell, letters count columns to the "
    "right and numbers rows downwards (each row is drawn shifted right by one)"
)

CATALOGUE: dict[str, GameRules] = {
    "tic_tac_toe": GameRules(
        "Be the first to line up three of your marks in a row, a column or a diagonal; a full board without a "
        "line is a draw.",
        "your mark and the cell as (row,column), rows and columns numbered 0 to 2 from the top left: x(1,1) "
        "marks the centre.",
        ("x, moving first", "o"),
    ),
    "phantom_ttt": GameRules(
        "Tic-tac-toe without seeing your opponent's marks: be the first to line up three of your marks in a "
        "row, a column or a diagonal. Trying a cell the opponent holds reveals it and you move again.",
        "your mark and the cell as (row,column), rows and columns numbered 0 to 2 from the top left: x(1,1) "
        "marks the centre.",
        ("x, moving first", "o"),
    ),
    "connect_four": GameRules(
        "Be the first to line up four of your discs in a row, a column or a diagonal; a full board is a draw.",
        "your disc's letter and a column number, 0 (left) to 6 (right): x3 drops an x into column 3, where it "
        "falls to the lowest empty cell.",
        ("x, moving first", "o"),
    ),
    "hex": GameRules(
        "Join your two edges of the board with an unbroken chain of your stones; the board cannot fill up "
        "without someone winning.",
        f"{_HEX_CELLS}; your move places a stone on that empty cell.",
        ("x, moving first, joining the top and bottom edges", "o, joining the left and right edges"),
    ),
    "dark_hex": GameRules(
        "Hex without seeing your opponent's stones: join your two edges with an unbroken chain of your stones. "
        "Trying a cell the opponent holds reveals it.",
        f"{_HEX_CELLS}.",
        ("x, moving first, joining the top and bottom edges", "o, joining the left and right edges"),
    ),
    "breakthrough": GameRules(
        "Be the first to move a piece onto the far row (your opponent's home row), or capture all of your "
        "opponent's pieces.",
        "the piece's square and its target square, columns a.. and rows 1..: b7b6 moves straight ahead, b7c6 "
        "diagonally; a piece moves one square forward, straight or diagonally, and captures only diagonally.",
        ("b (black), moving first from the top two rows downwards", "w (white), from the bottom two rows upwards"),
    ),
    "othello": GameRules(
        "Have more discs of your colour than your opponent when neither can move. A move must outflank a line "
        "of the opponent's discs, which then turn to your colour.",
        "the square as column letter and row number, as the board's edges label them: d3. 'pass' when no move "
        "is possible.",
        ("black (x), moving first", "white (o)"),
    ),
    "checkers": GameRules(
        "Capture all of your opponent's pieces or leave them without a move. Jumps are compulsory; a piece "
        "reaching the far row becomes a king and moves backwards too.",
        "the piece's square and the square it lands on, columns a.. and rows 1..: c3d4 (a jump names its "
        "landing square).",
        ("o, moving first, starting on rows 1-3", "+, starting on rows 6-8"),
    ),
    "chess": GameRules(
        "Checkmate your opponent's king. Stalemate, repetition and the fifty-move rule draw.",
        "standard algebraic notation: e4, Nf3, exd5, O-O (castling short), e8=Q (promotion).",
        ("black", "white, moving first"),
    ),
    "go": GameRules(
        "Control more of the board than your opponent at the end: your stones plus the empty points only you "
        "surround (white also gets the komi). Stones left without liberties are captured. Two passes in a row "
        "end the game.",
        "your colour and a point as column letter and row number, a1 at the bottom left (the letter i is "
        "skipped): 'B d4'; 'B PASS' passes.",
        ("black (B, X on the board), moving first", "white (W, O on the board)"),
    ),
    "dots_and_boxes": GameRules(
        "Complete more boxes than your opponent. Drawing the fourth side of a box scores it and gives you "
        "another move.",
        "your name and a line as (h or v, row, column): P1(h,0,1) draws the horizontal line right of dot "
        "(0,1), P1(v,0,1) the vertical line below it; dots are numbered from the top left.",
        ("P1, moving first", "P2"),
    ),
    "clobber": GameRules(
        "Make the last move: a player who cannot move loses.",
        "your piece's square and an orthogonally adjacent square holding an opponent's piece, which yours "
        "captures and replaces: a5b5 (columns a.., rows 1..).",
        ("o, moving first", "x"),
    ),
    "amazons": GameRules(
        "Make the last move: a player who cannot move loses.",
        "a turn is three moves: pick one of your amazons ('X From (r, c)'), move it like a chess queen ('X To "
        "(r, c)'), then shoot an arrow from it, again like a queen, onto a square that stays blocked "
        "('X Shoot: (r, c)'); squares are (row, column), counted from 1 at the top left.",
        ("X, moving first", "O"),
    ),
    "kuhn_poker": GameRules(
        "Win chips. Each player antes 1 and gets one card of J, Q, K (of N + 1 cards with N players); players "
        "may bet 1 more. The highest card still in at the end takes the pot; a player who folds loses what "
        "they put in.",
        "Pass (check, or fold facing a bet) or Bet (bet, or call facing a bet). The state shows your card as a "
        "number (0 is the lowest, J; then Q, K, ...) followed by the actions so far, p for Pass and b for Bet.",
    ),
    "leduc_poker": GameRules(
        "Win chips. Each player antes 1 and gets one private card from a deck of two suits of J, Q, K (more "
        "ranks with more players); one public card is shown after the first of two betting rounds. A pair "
        "with the public card beats any single card, then the higher card wins.",
        "Fold, Call (check when nothing is owed) or Raise (2 chips in round 1, 4 in round 2).",
    ),
    "liars_dice": GameRules(
        "Each player rolls dice in secret. Bids claim that at least Q of all dice show face F (6 is wild); "
        "each bid must be higher than the last. Calling 'Liar' ends the game: if the bid holds, the caller "
        "loses, else the bidder does.",
        "a bid as Q-F (at least Q dice show face F): 2-5; or Liar.",
    ),
    "nim": GameRules(
        "Players take objects from piles in turn. Under misere play (is_misere=true, OpenSpiel's default) "
        "whoever takes the last object loses; under normal play whoever takes it wins.",
        "pile:P, take:N; takes N objects from pile P (piles numbered from 1).",
    ),
    "pig": GameRules(
        "Be the first to reach the target score (winscore, 100 by default). On your turn roll the die as "
        "often as you like, adding each roll to your turn total; rolling a 1 loses the turn total, stopping "
        "banks it.",
        "roll or stop.",
    ),
    "backgammon": GameRules(
        "Be the first to bear off all fifteen of your checkers: move them round the board by the dice, and "
        "hit lone opposing checkers to send them back to the bar.",
        "the whole move name as listed, an id then the checker moves: '11 - 24/23 13/9' moves one checker "
        "from point 24 to 23 and one from 13 to 9; '*' marks a hit.",
        ("x, moving first", "o"),
    ),
    "mancala": GameRules(
        "Have more stones in your store than your opponent when one side's pits are empty. Sowing a pit drops "
        "its stones one by one counter-clockwise; ending in your store gives you another turn.",
        "the number of one of your pits: pits 1-6 are player 0's, 8-13 player 1's (7 and 0 are the stores).",
        ("pits 1-6, moving first", "pits 8-13"),
    ),
    "oware": GameRules(
        "Capture more than half the seeds (25 of 48). Sowing a house drops its seeds one by one "
        "counter-clockwise; ending in an opponent's house that then holds 2 or 3 seeds captures them.",
        "the letter of one of your houses: A-F for player 0, a-f for player 1.",
        ("houses A-F, moving first", "houses a-f"),
    ),
    "hanabi": GameRules(
        "Cooperative: all players share one score, the number of cards played in order on the fireworks (one "
        "pile per colour, ranks 1 upwards). You cannot see your own cards, only the others'. Hints spend "
        "information tokens, discards earn them back, and each misplay costs a life token.",
        "(Play i) or (Discard i) for the card in position i of your hand (from 0), or a hint such as (Reveal "
        "player +1 color R) or (Reveal player +1 rank 1) about another player's hand.",
    ),
    "goofspiel": GameRules(
        "Score more points than your opponent. Each round one point card is turned up (worth its number); every "
        "player bids one card of their own hand, unseen, and the highest bid wins the point card's value. Tied "
        "highest bids win nothing, and bid cards are spent.",
        "the whole move name as listed: '[P0]Bid: 3' bids your card 3.",
    ),
    "first_sealed_auction": GameRules(
        "Each player has a private value for the item and bids once, unseen; the highest bid wins the item "
        "and pays its bid, so the winner gains value minus bid and everyone else 0.",
        "the whole move name as listed: 'Player 0 bid: 3'.",
    ),
}

# The most cells of a matrix game's payoffs that its rules list; a larger table would swamp the prompt.
MAX_PAYOFF_CELLS = 100

_UTILITY = {
    pyspiel.GameType.Utility.ZERO_SUM: "zero-sum",
    pyspiel.GameType.Utility.CONSTANT_SUM: "constant-sum",
    pyspiel.GameType.Utility.GENERAL_SUM: "general-sum",
    pyspiel.GameType.Utility.IDENTICAL: "cooperative",
}


def utility_kind(game: pyspiel.Game) -> str:
    """zero-sum, constant-sum, general-sum or cooperative (every player gets the same return)."""
    return _UTILITY[game.get_type().utility]


def fallback_objective(game: pyspiel.Game) -> str:
    """The objective OpenSpiel's `GameType` and `GameInfo` state, for a game outside the catalogue."""
    low, high = game.min_utility(), game.max_utility()
    kind = utility_kind(game)
    if kind == "cooperative":
        return f"Cooperative: all players share one score, from {low:g} to {high:g}; make it as high as you can."
    if kind == "general-sum":
        return f"Make your own return as high as you can (returns run from {low:g} to {high:g})."
    return (
        f"Finish with a higher return than your opponents (returns run from {low:g} to {high:g}; one "
        f"player's gain is the others' loss)."
    )


def payoff_table(game: pyspiel.MatrixGame) -> str:
    """What each pair of moves pays the two players of a one-shot matrix game."""
    cells = [
        f"{game.row_action_name(row)} against {game.col_action_name(col)}: {game.player_utility(0, row, col):g} and "
        f"{game.player_utility(1, row, col):g}"
        for row in range(game.num_rows())
        for col in range(game.num_cols())
    ]
    return (
        f"Payoffs (player 0's move against player 1's: what player 0 gets and what player 1 gets): {'; '.join(cells)}."
    )


def rules_for(game: pyspiel.Game) -> GameRules:
    """The catalogue's rules of `game`, or rules built from its `GameType` and `GameInfo` (and, for a
    matrix game, its payoffs, which no state shows)."""
    objective = fallback_objective(game)
    if isinstance(game, pyspiel.MatrixGame) and game.num_rows() * game.num_cols() <= MAX_PAYOFF_CELLS:
        objective += " " + payoff_table(game)
    return CATALOGUE.get(game.get_type().short_name) or GameRules(
        objective, "the name of one of your legal moves, written exactly as listed."
    )
