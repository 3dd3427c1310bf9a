"""PettingZoo environments as text games.

`PettingZooGame` drives any PettingZoo environment with discrete action spaces behind the
`TextGame` protocol: an AEC environment as it is, a parallel (simultaneous-move) one through
PettingZoo's own `parallel_to_aec`, in which no player sees another's move of a round before
the round is over. The legal moves are the actions an action mask (in `obs["action_mask"]` or
`info["action_mask"]`) lets in, or every action of the space where there is no mask; they are
offered as their numbers, or by name where the game's author names them. It serves as the
`pettingzoo:MODULE` adapter, for example `pettingzoo:pettingzoo.classic.connect_four_v3`, and
`pettingzoo:MODULE.FACTORY` names any other function that makes an environment, for example
`pettingzoo:pettingzoo.classic.rps_v2.parallel_env`.

What a player sees, in order of preference: the author's `state_text(env, agent)`; the
environment's own text drawing, where it has `render_mode="ansi"`; a board drawn from feature
planes whose meaning is known (`PLANE_BOARDS`: the player's own pieces, the opponent's and the
empty cells, with what the action numbers mean); else the player's observation array. Other
plane-encoded environments are refused, as no reader could tell one plane from another.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import gymnasium
import numpy as np
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils.conversions import parallel_to_aec

from selfplay.errors import UserError
from selfplay.games.answers import normalize
from selfplay.games.base import TextGame

_NUMBER = re.compile(r"-?\d+")
# What the author of a game gives to show the state and name the moves, called with the
# environment as the adapter drives it (an AEC environment) and an agent's name or an action.
StateText = Callable[[AECEnv, str], str]
MoveName = Callable[[AECEnv, int], str]
MoveNames = Mapping[int, str] | Sequence[str] | MoveName


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
    """Any PettingZoo environment with discrete actions; moves are action numbers or the author's names.

    `module_name` is a module with an `env()` (or only a `parallel_env()`) function, or
    MODULE.FACTORY naming any function that returns an AEC or a parallel environment; `params`
    go to it. `state_text(env, agent)` gives the state as `agent` sees it, `move_names` names
    the actions (a mapping or sequence by action number, or a function of the environment and
    the action) and `rules` replaces the generic rules text: a game's author supplies these to
    show the game better than its observation arrays, without subclassing.
    """

    def __init__(
        self,
        module_name: str,
        *,
        state_text: StateText | None = None,
        move_names: MoveNames | None = None,
        rules: str | None = None,
        **params,
    ):
        # PettingZoo's board games import pygame only to draw; keep its banner out of our output.
        os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
        if state_text is not None and not callable(state_text):
            raise UserError(
                f"state_text for '{module_name}' is a {type(state_text).__name__}; it must be a function "
                f"(env, agent) -> str."
            )
        self._state_text = state_text
        self._move_name = _move_namer(module_name, move_names)
        factory = _environment_factory(module_name)
        self.env = _make_environment(factory, module_name, params)
        if "render_mode" not in params and "ansi" in self.env.metadata.get("render_modes", ()):
            self.env.close()
            self.env = _make_environment(factory, module_name, {**params, "render_mode": "ansi"})
        self._renders = getattr(self.env, "render_mode", None) == "ansi"
        self.module_name = module_name
        self.name = self.env.metadata.get("name", module_name)
        self.agents: list = list(self.env.possible_agents)
        self.agent_names = tuple(str(agent) for agent in self.agents)
        self.num_players = len(self.agents)
        for agent in self.agents:
            if not isinstance(self.env.action_space(agent), gymnasium.spaces.Discrete):
                raise UserError(
                    f"'{self.name}' has a {type(self.env.action_space(agent)).__name__} action space for "
                    f"{agent}; only Discrete action spaces can be played as numbered moves."
                )
        # PettingZoo's episode length in rounds: a game that reaches it is over, not cut short.
        max_cycles = getattr(self.env.unwrapped, "max_cycles", None)
        self._fixed_length = isinstance(max_cycles, int)
        if self._fixed_length:
            self.max_length = max_cycles * self.num_players
        self.simultaneous = bool(self.env.metadata.get("is_parallelizable"))
        self.env.reset(seed=0)
        self.observation_shape = self._observation(self.agents[0]).shape
        self.board = None if state_text is not None or self._renders else self._plane_board()
        self.rules = rules if rules is not None else self.rules_text()
        self._returns = dict.fromkeys(self.agents, 0.0)
        self._truncated = False

    # -- the state machine ---------------------------------------------------------------

    def reset(self, rng: np.random.Generator) -> None:
        self.env.reset(seed=int(rng.integers(2**31)))
        self._returns = dict.fromkeys(self.agents, 0.0)
        self._truncated = False

    def current_player(self) -> int:
        return self.agents.index(self.env.agent_selection)

    def _legal_actions(self) -> list[int]:
        """The mover's masked-in actions, or every action of its space where it has no mask."""
        space = self.env.action_space(self.env.agent_selection)
        obs, _, _, _, info = self.env.last()
        mask = obs["action_mask"] if isinstance(obs, dict) and "action_mask" in obs else info.get("action_mask")
        indices = range(space.n) if mask is None else np.flatnonzero(mask)
        return [int(space.start) + int(i) for i in indices]

    def _moves(self) -> dict[str, int]:
        """The mover's legal moves by name, each with its action."""
        moves: dict[str, int] = {}
        for action in self._legal_actions():
            name = str(action) if self._move_name is None else str(self._move_name(self.env, action)).strip()
            if name in moves:
                raise UserError(
                    f"move_names of '{self.module_name}' names actions {moves[name]} and {action} both '{name}'; "
                    f"give each legal action its own name."
                )
            moves[name] = action
        return moves

    def legal_moves(self) -> list[str]:
        return list(self._moves())

    def parse_move(self, answer: str) -> str | None:
        if self._move_name is not None:
            return super().parse_move(answer)
        numbers = _NUMBER.findall(normalize(answer))
        if len(numbers) != 1:
            return None
        move = str(int(numbers[0]))
        return move if move in self.legal_moves() else None

    def apply(self, move: str) -> None:
        self._step(self._moves()[move])
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
        return self._truncated and not self._fixed_length

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
                f"{', '.join(PLANE_BOARDS)}; give the adapter a state_text function (games/README.md, PettingZoo "
                f"environments) to show another, or play an OpenSpiel game (openspiel:NAME)."
            )
        return board

    def rules_text(self) -> str:
        rules = (
            f"You are playing {self.name}, the PettingZoo environment {self.module_name}, with "
            f"{self.num_players} players ({', '.join(self.agent_names)} in the environment's own names). "
            f"When the game ends each player gets the environment's reward (in board games usually "
            f"+1 for a win, -1 for a loss, 0 for a draw)."
        )
        if self.simultaneous:
            rules += (
                " Moves are simultaneous: in each round every player chooses a move without seeing the "
                "others' choices of that round."
            )
        if self.board is None:
            seen = "the game as the environment draws it" if self._renders else "your own observation of the game"
            moves = "their numbers; your move is one of those numbers" if self._move_name is None else "their names"
            return (
                f"{rules}\nObjective: end with the highest reward.\nEach turn you see {seen} and your legal "
                f"moves, by {moves}."
            )
        rows, columns = self.observation_shape[:2]
        moves = self.board.moves.format(rows=rows, columns=columns, last_column=columns - 1, points=rows * columns)
        return (
            f"{rules}\nObjective: {self.board.objective}\nEach turn you see the board: X marks your pieces, "
            f"O your opponent's, '.' an empty cell; rows are numbered from 0 at the top, columns from 0 at the "
            f"left.\nMoves: {moves}"
        )

    def _observation(self, agent) -> np.ndarray:
        obs = self.env.observe(agent)
        return np.asarray(obs["observation"] if isinstance(obs, dict) else obs)

    def describe(self, player: int) -> str:
        agent = self.agents[player]
        if self._state_text is not None:
            return str(self._state_text(self.env, agent))
        if self._renders:
            return str(self.env.render())
        obs = self._observation(agent)
        if self.board is not None:
            own, opponent = self.board.planes_of(to_move=player == self.current_player())
            return f"The board (X: yours, O: your opponent's):\n{_board(obs, own, opponent)}"
        if obs.ndim == 0:
            return f"Your observation: {obs.item()}"
        numbers = np.array2string(obs, precision=3, suppress_small=True, threshold=obs.size, max_line_width=100)
        return f"Your observation, an array of shape {obs.shape}:\n{numbers}"

    def observation_tensor(self, player: int) -> np.ndarray:
        return self._observation(self.agents[player]).astype(np.float32)


def _move_namer(module_name: str, move_names: MoveNames | None) -> MoveName | None:
    """`move_names` as a function of the environment and an action."""
    if move_names is None or callable(move_names):
        return move_names
    if isinstance(move_names, str) or not isinstance(move_names, Mapping | Sequence):
        raise UserError(
            f"move_names for '{module_name}' is a {type(move_names).__name__}; give a mapping or a list from "
            f"action numbers to names, or a function (env, action) -> str."
        )
    names = move_names if isinstance(move_names, Mapping) else dict(enumerate(move_names))

    def name_of(env: AECEnv, action: int) -> str:
        if action not in names:
            raise UserError(f"move_names for '{module_name}' has no name for action {action}; name every action.")
        return names[action]

    return name_of


def _environment_factory(name: str) -> Callable[..., object]:
    """The function that makes the environment `name` names: a module's env(), or its
    parallel_env() where it has no env(), or the function MODULE.FACTORY."""
    try:
        module = importlib.import_module(name)
    except ImportError as err:
        module_name, _, attribute = name.rpartition(".")
        factory = _module_function(module_name, attribute) if err.name == name and module_name else None
        if factory is None:
            raise UserError(
                f"Cannot import the PettingZoo environment module '{name}': {err}. Check the module path (or "
                f"MODULE.FACTORY for a function that makes an environment, such as "
                f"pettingzoo.classic.rps_v2.parallel_env), and install what it needs (for example pip install "
                f"'pettingzoo[classic]')."
            ) from None
        return factory
    for attribute in ("env", "parallel_env"):
        if callable(getattr(module, attribute, None)):
            return getattr(module, attribute)
    raise UserError(
        f"Module '{name}' has no env() or parallel_env() function; name a PettingZoo environment module such as "
        f"pettingzoo.classic.connect_four_v3, or a function that makes an environment as MODULE.FACTORY."
    )


def _module_function(module_name: str, attribute: str) -> Callable[..., object] | None:
    try:
        factory = getattr(importlib.import_module(module_name), attribute, None)
    except ImportError:
        return None
    return factory if callable(factory) else None


def _make_environment(factory: Callable[..., object], name: str, params: dict) -> AECEnv:
    """The AEC environment `factory(**params)` makes, a parallel one through `parallel_to_aec`."""
    try:
        env = factory(**params)
    except TypeError as err:
        raise UserError(f"{name} does not take the parameters {params}: {err}") from None
    if isinstance(env, ParallelEnv):
        return parallel_to_aec(env)
    if not isinstance(env, AECEnv):
        raise UserError(f"{name} made a {type(env).__name__}, not a PettingZoo AEC or parallel environment.")
    return env


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
