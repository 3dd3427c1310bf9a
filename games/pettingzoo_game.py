"""PettingZoo AEC environments as text games.

`PettingZooGame` drives any AEC environment with a discrete action space and an action mask
(in `obs["action_mask"]` or `info["action_mask"]`) behind the `TextGame` protocol: moves are
the numbers of the masked-in actions, and the state text renders the player's own
observation array, as a board when it is a stack of 0/1 planes. It serves as the
`pettingzoo:MODULE` adapter, for example `pettingzoo:pettingzoo.classic.connect_four_v3`.

A board that an environment encodes as feature planes is drawn only where the meaning of its
planes is known (`PLANE_BOARDS`): the player's own pieces, the opponent's and the empty cells,
with what the action numbers mean. Other plane-encoded environments are refused, as no reader
could tell one plane from another.
"""

from __future__ import annotations

import importlib
import os
import re
from dataclasses import dataclass

import gymnasium
import numpy as np

from selfplay.errors import UserError
from selfplay.games.answers import normalize
from selfplay.games.base import TextGame

_NUMBER = re.compile(r"-?\d+")


@dataclass(frozen=True)
class PlaneBoard:
    """What the feature planes of a PettingZoo board game mean, and how its moves are numbered
    (`moves` is formatted with the board's `rows` and `columns`)."""

    own: int  # the plane of the observing player's pieces
    opponent: int  # the plane of the opponent's pieces
    objective: str
    moves: str
    # go_v5 stacks the last mover's stones first whoever observes: its planes swap for the player to move.
    last_mover_first: bool = False

    def planes_of(self, to_move: bool) -> tuple[int, int]:
        """The (own, opponent) planes as a player to move or waiting sees them."""
        return (self.opponent, self.own) if self.last_mover_first and to_move else (self.own, self.opponent)


# By environment name without its version suffix, from each environment's documentation.
PLANE_BOARDS = {
    "connect_four": PlaneBoard(
        0,
        1,
        "Be the first to line up four of your pieces in a row, a column or a diagonal.",
        "Your move is a column number, 0 (left) to {last_column} (right); your piece drops to the lowest "
        "empty cell of that column.",
    ),
    "tictactoe": PlaneBoard(
        0,
        1,
        "Be the first to line up three of your marks in a row, a column or a diagonal.",
        "Your move is the number of an empty cell, counted down each column: the cell in row r and column c "
        "is {rows} * c + r (row 0, column 0 is 0; row 2, column 2 is 8).",
    ),
    "go": PlaneBoard(
        0,
        1,
        "Surround more of the board than your opponent (stones plus enclosed points, komi to white).",
        "Your move is the number of a point: row r and column c is {columns} * r + c (row 0, column 0 is "
        "0); {points} passes.",
        last_mover_first=True,
    ),
}


class PettingZooGame(TextGame):
    """Any PettingZoo AEC environment with discrete, masked actions; moves are action numbers."""

    def __init__(self, module_name: str, **params):
        # PettingZoo's board games import pygame only to draw; keep its banner out of our output.
        os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise UserError(
                f"Cannot import the PettingZoo environment module '{module_name}': {err}. Check the module "
                f"path, and install what it needs (for example pip install 'pettingzoo[classic]')."
            ) from None
        if not callable(getattr(module, "env", None)):
            raise UserError(
                f"Module '{module_name}' has no env() function; name a PettingZoo environment module "
                f"such as pettingzoo.classic.connect_four_v3."
            )
        try:
            self.env = module.env(**params)
        except TypeError as err:
            raise UserError(f"{module_name}.env() does not take the parameters {params}: {err}") from None
        self.module_name = module_name
        self.name = self.env.metadata.get("name", module_name)
        self.agents: list[str] = list(self.env.possible_agents)
        self.num_players = len(self.agents)
        for agent in self.agents:
            if not isinstance(self.env.action_space(agent), gymnasium.spaces.Discrete):
                raise UserError(
                    f"'{self.name}' has a {type(self.env.action_space(agent)).__name__} action space for "
                    f"{agent}; only Discrete action spaces can be played as numbered moves."
                )
        self.env.reset(seed=0)
        if self._mask() is None:
            raise UserError(
                f"'{self.name}' gives no action mask (obs['action_mask'] or info['action_mask']), so the "
                f"legal moves are unknown; only environments with action masks can be played."
            )
        self.observation_shape = self._observation(self.agents[0]).shape
        self.board = self._plane_board()
        self.rules = self.rules_text()
        self._returns = dict.fromkeys(self.agents, 0.0)
        self._truncated = False

    # -- the state machine ---------------------------------------------------------------

    def reset(self, rng: np.random.Generator) -> None:
        self.env.reset(seed=int(rng.integers(2**31)))
        self._returns = dict.fromkeys(self.agents, 0.0)
        self._truncated = False

    def current_player(self) -> int:
        return self.agents.index(self.env.agent_selection)

    def _mask(self) -> np.ndarray | None:
        obs, _, _, _, info = self.env.last()
        if isinstance(obs, dict) and "action_mask" in obs:
            return obs["action_mask"]
        return info.get("action_mask")

    def legal_moves(self) -> list[str]:
        start = int(self.env.action_space(self.env.agent_selection).start)
        return [str(start + i) for i in np.flatnonzero(self._mask())]

    def parse_move(self, answer: str) -> str | None:
        numbers = _NUMBER.findall(normalize(answer))
        if len(numbers) != 1:
            return None
        move = str(int(numbers[0]))
        return move if move in self.legal_moves() else None

    def apply(self, move: str) -> None:
        self._step(int(move))
        # Finished agents stay listed until stepped with None; the game goes on only after.
        while self.env.agents and self._finished(self.env.agent_selection):
            self._step(None)

    def _step(self, action: int | None) -> None:
        self.env.step(action)
        # PettingZoo drops an agent's reward once it is stepped out, so collect them every step.
        for agent, reward in self.env.rewards.items():
            self._returns[agent] += float(reward)
        self._truncated |= any(self.env.truncations.values())

    def _finished(self, agent: str) -> bool:
        return bool(self.env.terminations[agent] or self.env.truncations[agent])

    def is_over(self) -> bool:
        return not self.env.agents

    def returns(self) -> list[float]:
        return [self._returns[agent] for agent in self.agents]

    def truncated(self) -> bool:
        return self._truncated

    # -- text and tensors -------------------------------------------------------------------

    def _plane_board(self) -> PlaneBoard | None:
        """The meaning of the observation's board planes, or None where it is not a board; raises
        for a plane-encoded board whose planes are unknown."""
        obs = self._observation(self.agents[0])
        if obs.ndim != 3 or not np.isin(obs, (0, 1)).all():
            return None
        board = PLANE_BOARDS.get(re.sub(r"_v\d+$", "", self.name))
        if board is None:
            raise UserError(
                f"'{self.name}' encodes its board as {obs.shape[2]} feature planes whose meaning selfplay does not "
                f"know, so it cannot draw a board a player could read. Plane boards it draws: "
                f"{', '.join(PLANE_BOARDS)}; other PettingZoo environments with flat observations, and OpenSpiel "
                f"games (openspiel:NAME), are played as they are."
            )
        return board

    def rules_text(self) -> str:
        rules = (
            f"You are playing {self.name}, the PettingZoo environment {self.module_name}, with "
            f"{self.num_players} players ({', '.join(self.agents)} in the environment's own names). "
            f"When the game ends each player gets the environment's reward (in board games usually "
            f"+1 for a win, -1 for a loss, 0 for a draw)."
        )
        if self.board is None:
            return (
                f"{rules}\nObjective: end with the highest reward.\nEach turn you see your own observation "
                f"of the game and the numbers of your legal actions; your move is one of those numbers."
            )
        rows, columns = self.observation_shape[:2]
        moves = self.board.moves.format(rows=rows, columns=columns, last_column=columns - 1, points=rows * columns)
        return (
            f"{rules}\nObjective: {self.board.objective}\nEach turn you see the board: X marks your pieces, "
            f"O your opponent's, '.' an empty cell; rows are numbered from 0 at the top, columns from 0 at the "
            f"left.\nMoves: {moves}"
        )

    def _observation(self, agent: str) -> np.ndarray:
        obs = self.env.observe(agent)
        return np.asarray(obs["observation"] if isinstance(obs, dict) else obs)

    def describe(self, player: int) -> str:
        obs = self._observation(self.agents[player])
        intro = f"In {self.name} you are the agent '{self.agents[player]}'."
        if self.board is not None:
            own, opponent = self.board.planes_of(to_move=player == self.current_player())
            return f"{intro} The board (X: yours, O: your opponent's):\n{_board(obs, own, opponent)}"
        numbers = np.array2string(obs, precision=3, suppress_small=True, threshold=obs.size, max_line_width=100)
        return f"{intro} Your observation, an array of shape {obs.shape}:\n{numbers}"

    def observation_tensor(self, player: int) -> np.ndarray:
        return self._observation(self.agents[player]).astype(np.float32)


def _board(planes: np.ndarray, own: int, opponent: int) -> str:
    """The `own` and `opponent` planes of a (rows, columns, planes) stack drawn as a grid with
    numbered rows and columns."""
    rows, columns, _ = planes.shape
    width = len(str(max(rows, columns) - 1)) + 1
    lines = [" " * width + "".join(f"{c:>{width}}" for c in range(columns))]
    for r in range(rows):
        cells = ["X" if planes[r, c, own] else "O" if planes[r, c, opponent] else "." for c in range(columns)]
        lines.append(f"{r:>{width}}" + "".join(f"{cell:>{width}}" for cell in cells))
    return "\n".join(lines)
