"""PettingZoo AEC environments as text games.

`PettingZooGame` drives any AEC environment with a discrete action space and an action mask
(in `obs["action_mask"]` or `info["action_mask"]`) behind the `TextGame` protocol: moves are
the numbers of the masked-in actions, and the state text renders the player's own
observation array, as a board when it is a stack of 0/1 planes. It serves as the
`pettingzoo:MODULE` adapter, for example `pettingzoo:pettingzoo.classic.connect_four_v3`.
"""

from __future__ import annotations

import importlib
import os
import re
import sys

import gymnasium
import numpy as np

from selfplay.errors import UserError
from selfplay.games.answers import normalize
from selfplay.games.base import TextGame

# Cell symbols of the board planes, in plane order.
_PLANE_SYMBOLS = "XOABCDEFGHIJKLMNPQRSTUVWYZ"
_NUMBER = re.compile(r"-?\d+")
# The part of a PettingZoo environment's documentation that says what its action numbers mean.
_ACTION_DOCS = re.compile(r"^#+ Action Space\s*\n(.*?)(?=^#|\Z)", re.MULTILINE | re.DOTALL)


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

    def rules_text(self) -> str:
        rules = (
            f"You are playing {self.name}, the PettingZoo environment {self.module_name}, with "
            f"{self.num_players} players ({', '.join(self.agents)} in the environment's own names). "
            f"Each turn you see your own observation of the game and the numbers of your legal "
            f"actions; your move is one of those numbers. When the game ends each player gets the "
            f"environment's reward (in board games usually +1 for a win, -1 for a loss, 0 for a draw)."
        )
        docs = _ACTION_DOCS.search(sys.modules[type(self.env.unwrapped).__module__].__doc__ or "")
        if docs is not None:
            rules += "\n\nWhat the action numbers mean, from the environment's documentation:\n" + docs[1].strip()
        return rules

    def _observation(self, agent: str) -> np.ndarray:
        obs = self.env.observe(agent)
        return np.asarray(obs["observation"] if isinstance(obs, dict) else obs)

    def describe(self, player: int) -> str:
        obs = self._observation(self.agents[player])
        intro = f"In {self.name} you are the agent '{self.agents[player]}'."
        binary = np.isin(obs, (0, 1)).all()
        if obs.ndim == 3 and obs.shape[2] <= len(_PLANE_SYMBOLS) and binary:
            return f"{intro}\n{_board(obs)}"
        numbers = np.array2string(obs, precision=3, suppress_small=True, threshold=obs.size, max_line_width=100)
        return f"{intro} Your observation, an array of shape {obs.shape}:\n{numbers}"

    def observation_tensor(self, player: int) -> np.ndarray:
        return self._observation(self.agents[player]).astype(np.float32)


def _board(planes: np.ndarray) -> str:
    """A (rows, columns, planes) stack of 0/1 planes drawn as a grid, one symbol per plane."""
    rows, columns, count = planes.shape
    legend = ", ".join(f"{_PLANE_SYMBOLS[k]} = plane {k}" for k in range(count))
    width = len(str(max(rows, columns) - 1)) + 1
    lines = [
        f"Your observation is a board of {rows} rows and {columns} columns with {count} feature planes, "
        f"drawn as a grid: {legend}; '.' = no plane set, '*' = several. In PettingZoo board games "
        f"plane 0 usually holds your own pieces and plane 1 the opponent's.",
        " " * width + "".join(f"{c:>{width}}" for c in range(columns)),
    ]
    for r in range(rows):
        cells = []
        for c in range(columns):
            present = np.flatnonzero(planes[r, c])
            cells.append("." if len(present) == 0 else _PLANE_SYMBOLS[present[0]] if len(present) == 1 else "*")
        lines.append(f"{r:>{width}}" + "".join(f"{cell:>{width}}" for cell in cells))
    return "\n".join(lines)
