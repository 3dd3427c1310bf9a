"""The text-game protocol.

A `TextGame` holds one game's rules and state and knows nothing of PettingZoo or models.
`TextGameEnv` turns any TextGame into a PettingZoo AEC environment that a language model can
play: each observation carries prompt-ready text (the rules, the state as that player sees
it, the legal moves and the answer format, and that player's view of the state alone) beside a
numeric tensor, and each action is the model's raw output string, parsed by the environment.
Output that names no legal move never raises: it is recorded in `infos` and handled by the
game's `InvalidMovePolicy`.
"""

from __future__ import annotations

import re
import string
import unicodedata
from abc import ABC, abstractmethod
from dataclasses import dataclass

import gymnasium
import numpy as np
from pettingzoo import AECEnv
from pettingzoo.utils import AgentSelector

from selfplay.errors import UserError
from selfplay.games.answers import BOXED, AnswerFormat, AnswerGrammar, normalize

# Observation text is kept to printable ASCII so it always lies inside the Text spaces.
_TEXT_SPACE_CHARSET = string.printable
_OUTSIDE_CHARSET = re.compile(f"[^{re.escape(_TEXT_SPACE_CHARSET)}]")
MAX_TEXT_LENGTH = 32_768
# The turn cap of a game that states no maximum length of its own (and of a run that sets none).
UNBOUNDED_GAME_TURN_CAP = 1000
# Terminal colour codes (OpenSpiel's Twixt colours its board) carry nothing a reader needs.
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# ASCII stand-ins for the symbols OpenSpiel games write beyond box drawing and playing cards.
_SYMBOLS = {"\u2660": "S", "\u2663": "C", "\u2665": "H", "\u2666": "D", "\u2190": "<-", "\u2192": "->"}
_SYMBOLS.update({"\u2661": "H", "\u2662": "D", "\u2664": "S", "\u2667": "C", "\u2191": "^", "\u2193": "v"})
_SYMBOLS.update({"\u25cf": "@", "\u25cb": "O", "\u26ab": "@", "\u26aa": "O", "\u00d7": "x", "\u00b7": "."})
_CARD_RANKS = {"ACE": "A", "KING": "K", "QUEEN": "Q", "KNIGHT": "C", "JACK": "J", "TEN": "T", "NINE": "9"}
_CARD_RANKS.update({"EIGHT": "8", "SEVEN": "7", "SIX": "6", "FIVE": "5", "FOUR": "4", "THREE": "3", "TWO": "2"})
# Enough of an invalid output to diagnose it without storing whole responses in infos.
_RECORDED_OUTPUT_CHARS = 200


class TextGame(ABC):
    """Rules and state of one game for `num_players` seats, playable through text.

    Subclasses set `rules` (shown to every player) and `observation_shape`, and implement
    the state machine below. Moves are named by short canonical strings (for example "4" or
    "bet"); `parse_move` maps a model's extracted answer to one of them.
    """

    num_players: int = 2
    rules: str = ""
    observation_shape: tuple[int, ...] = (1,)
    answer_format: AnswerFormat = BOXED
    # The environment's agent names per seat (default player_0, player_1, ...), and the role each
    # seat plays, which is what advantages are grouped by and league role slots are keyed on
    # (default: the agent name). Several seats may share a role, e.g. ("proposer", "solver", "solver").
    agent_names: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()
    zero_sum: bool = True  # the seats' returns always sum to 0
    cooperative: bool = False  # every seat gets the same return: a team score, not wins and losses
    # How evaluation judges play (`selfplay.evaluation.game_kinds`): by the mean return where
    # returns are amounts won (chips, points) that luck spreads, as in poker and dice games; else,
    # in a zero-sum game, by wins, draws and losses. A game that is not zero-sum is always judged
    # by each side's own mean return, a cooperative game by its team score.
    judged_by_return: bool = False
    # Poker games: the chips of one big blind, for milli-big-blinds per hand; None otherwise.
    big_blind: float | None = None
    # `legal_moves` names every legal move; False where moves are free text and it gives examples
    # (legal decoding, which writes only listed moves, needs it True).
    lists_every_move: bool = True
    # The most moves a game can last, where the game bounds it (OpenSpiel's max_game_length()):
    # the environment's turn cap unless the user sets one. None: the game states no bound.
    max_length: int | None = None

    @abstractmethod
    def reset(self, rng: np.random.Generator) -> None:
        """Start a new episode; all randomness (cards, dice, values) comes from `rng`."""

    @abstractmethod
    def current_player(self) -> int:
        """Seat index of the player to move."""

    @abstractmethod
    def legal_moves(self) -> list[str]:
        """Canonical names of the current player's legal moves."""

    @abstractmethod
    def apply(self, move: str) -> None:
        """Play a legal move for the current player."""

    @abstractmethod
    def is_over(self) -> bool: ...

    @abstractmethod
    def returns(self) -> list[float]:
        """Final reward of each seat; called once the game is over."""

    @abstractmethod
    def describe(self, player: int) -> str:
        """The state as `player` sees it: no hidden information of other players."""

    @abstractmethod
    def observation_tensor(self, player: int) -> np.ndarray:
        """A numeric view of what `player` sees, of shape `observation_shape`."""

    def parse_move(self, answer: str) -> str | None:
        """The legal move that an extracted answer names, or None."""
        wanted = normalize(answer)
        for move in self.legal_moves():
            if normalize(move) == wanted:
                return move
        return None

    def unreadable_move(self) -> str | None:
        """The move that stands for output naming no legal move, in games that score such output
        themselves (a failed attempt with a format penalty) and go on. None, the default, leaves
        it to the environment's `InvalidMovePolicy`. Either way the output is logged as invalid."""
        return None

    def truncated(self) -> bool:
        """Whether a game that is over was stopped by a cap of its own (for example a PettingZoo
        environment's truncation) rather than played out; reported apart from draws."""
        return False

    def answer_grammar(self) -> AnswerGrammar:
        """The form the mover's answer takes under structured decoding: by default one of the
        legal moves in the answer format. A game whose moves are free text (`lists_every_move`
        False) declares its own, free inside its markers."""
        if not self.lists_every_move:
            raise UserError(
                f"{type(self).__name__} takes free text and declares no answer grammar, which structured decoding "
                "needs: play it with free decoding, or give the game an `answer_grammar`."
            )
        return AnswerGrammar.one_of(self.answer_format, self.legal_moves())

    def outcome_figures(self, seat: int) -> dict[str, float]:
        """Named figures of the finished game for what `seat`'s role did, beside its return (a
        role game's attack success, a solver's correctness); evaluation reports each one's mean
        and paired difference. None by default."""
        return {}

    def training_metrics(self) -> dict[str, float]:
        """Figures about the game itself that the trainer logs after each step (for example a
        task buffer's diversity); shared state across instances, since any one is asked."""
        return {}

    def moves_prompt(self) -> str:
        """How the legal moves are listed in the prompt; long move lists override this."""
        moves = self.legal_moves()
        if any("," in move for move in moves):
            return "Legal moves, one per line:\n" + "\n".join(moves)
        return "Legal moves: " + ", ".join(moves)


def declares_answer_grammar(game: TextGame) -> bool:
    """Whether structured decoding can play `game`: it lists its moves, or declares the form of
    its free-text answers."""
    return game.lists_every_move or type(game).answer_grammar is not TextGame.answer_grammar


@dataclass(frozen=True)
class InvalidMovePolicy:
    """What happens when a player's output names no legal move.

    The player gets `retries` further attempts at the same turn; after that the game ends at
    once with `penalty` for the offender and `opponent_reward` for every other player
    (SPIRAL's training values by default). An output that marks an answer in the game's answer
    format, though not a legal move or cut off after it, is penalised `penalty + format_credit`
    instead: credit for the format alone, as DeepSeek-R1's format reward gives, so that a model
    that never writes a legal move still has something to learn from.
    """

    retries: int = 0
    penalty: float = -1.5
    opponent_reward: float = 0.5
    format_credit: float = 0.0


@dataclass(frozen=True)
class UnfinishedOutput:
    """A response cut off at the token limit: always an invalid move, whatever it says."""

    text: str


class TextGameEnv(AECEnv):
    """A PettingZoo AEC environment over a `TextGame`; actions are raw output strings.

    Observations are dicts: `observation` (the game's numeric tensor), `rules` (fixed for
    the game), `state` (this player's view, the legal moves when it is their turn, and
    the answer instruction) and `view` (this player's view alone, `TextGame.describe`). A game
    that reaches `max_turns` valid moves (by default the game's own `max_length`) is truncated:
    every reward 0, agents truncated, `end_reason` "turn_cap", as is a game stopped by a cap of
    its own (`TextGame.truncated`).
    `infos[agent]["invalid_moves"]` lists every invalid output of that agent in the episode.
    """

    metadata = {"render_modes": ["human", "ansi"], "is_parallelizable": False}

    def __init__(
        self,
        game: TextGame,
        *,
        name: str,
        invalid_moves: InvalidMovePolicy = InvalidMovePolicy(),
        max_turns: int | None = None,
        render_mode: str | None = None,
    ):
        super().__init__()
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}")
        self.game = game
        self.metadata = {**self.metadata, "name": name}
        self.invalid_moves = invalid_moves
        self.max_turns = max_turns or game.max_length or UNBOUNDED_GAME_TURN_CAP
        self.render_mode = render_mode
        self.possible_agents = list(game.agent_names) or [f"player_{i}" for i in range(game.num_players)]
        self._seat = {agent: i for i, agent in enumerate(self.possible_agents)}
        text = gymnasium.spaces.Text(MAX_TEXT_LENGTH, min_length=0, charset=_TEXT_SPACE_CHARSET)
        obs_space = gymnasium.spaces.Dict(
            {
                "observation": gymnasium.spaces.Box(-np.inf, np.inf, shape=game.observation_shape, dtype=np.float32),
                "rules": text,
                "state": text,
                "view": text,
            }
        )
        self.observation_spaces = {a: obs_space for a in self.possible_agents}
        action_space = gymnasium.spaces.Text(MAX_TEXT_LENGTH, min_length=0, charset=_TEXT_SPACE_CHARSET)
        self.action_spaces = {a: action_space for a in self.possible_agents}
        self._rng = np.random.default_rng()

    def observation_space(self, agent: str) -> gymnasium.spaces.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> gymnasium.spaces.Space:
        return self.action_spaces[agent]

    # -- episode ---------------------------------------------------------------------

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.game.reset(self._rng)
        self.start_episode()

    def start_episode(self) -> None:
        """Begin an episode at the game's current state without resetting the game.

        `reset` deals a fresh game and calls this; a probe that has put the game in a chosen
        position (for example with `OpenSpielGame.reset_to`) calls it directly.
        """
        self.agents = self.possible_agents[:]
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        # Kept for the whole episode: PettingZoo drops finished agents from infos and rewards.
        self.invalid_log: dict[str, list[dict]] = {a: [] for a in self.agents}
        self.episode_returns = {a: 0.0 for a in self.agents}
        self.infos = {a: {"invalid_moves": self.invalid_log[a]} for a in self.agents}
        self.turns = 0
        self.end_reason: str | None = None
        self._failed_attempts = 0
        # After a step whose invalid output the player may retry: the penalty it would have ended
        # the game with, by which the learner scores that attempt (`Turn.retried_penalty`).
        self.retried_penalty: float | None = None
        self._feedback: str | None = None
        self._legal_moves: list[str] | None = None
        self._agent_selector = AgentSelector(self.agents)
        self.agent_selection = self.possible_agents[self.game.current_player()]

    def step(self, action: str) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        self.rewards = {a: 0.0 for a in self.agents}
        self.retried_penalty = None

        move, reason = self._read_move(action)
        if move is None and self.game.unreadable_move() is not None:
            self._log_invalid(agent, action, reason)
            move = self.game.unreadable_move()
        if move is None:
            self._on_invalid(agent, action, reason)
        else:
            self._failed_attempts = 0
            self._feedback = None
            self.game.apply(move)
            self._legal_moves = None
            self.turns += 1
            if self.game.is_over():
                truncated = self.game.truncated()
                returns = dict(zip(self.possible_agents, self.game.returns()))
                self._finish("turn_cap" if truncated else "game_over", returns, truncated=truncated)
            elif self.turns >= self.max_turns:
                self._finish("turn_cap", {a: 0.0 for a in self.agents}, truncated=True)
            else:
                self.agent_selection = self.possible_agents[self.game.current_player()]
        self._accumulate_rewards()
        for a, r in self.rewards.items():
            self.episode_returns[a] += r
        if self.render_mode == "human":
            self.render()

    def _read_move(self, action: object) -> tuple[str | None, str]:
        if isinstance(action, UnfinishedOutput):
            return None, "the response was cut off at the token limit"
        if not isinstance(action, str):
            return None, f"expected the model's output text, got {type(action).__name__}"
        answer = self.game.answer_format.extract(action)
        if answer is None:
            example = self.game.answer_format.wrap("...")
            return None, f"no answer found: the move must be written as {example}"
        move = self.game.parse_move(answer)
        if move is None:
            return None, f"'{_excerpt(answer, 40)}' is not a legal move"
        return move, ""

    def _log_invalid(self, agent: str, action: object, reason: str) -> None:
        self.invalid_log[agent].append(
            {"turn": self.turns, "reason": reason, "output": _excerpt(_output_text(action), _RECORDED_OUTPUT_CHARS)}
        )

    def _on_invalid(self, agent: str, action: object, reason: str) -> None:
        self._log_invalid(agent, action, reason)
        policy = self.invalid_moves
        text = _output_text(action) if isinstance(action, str | UnfinishedOutput) else ""
        marked = self.game.answer_format.extract(text) is not None
        penalty = policy.penalty + (policy.format_credit if marked else 0.0)
        self._failed_attempts += 1
        if self._failed_attempts <= policy.retries:
            self._feedback = f"Your previous answer was invalid ({reason}). Try again."
            self.retried_penalty = penalty
            return
        self._finish("invalid_move", {a: penalty if a == agent else policy.opponent_reward for a in self.agents})

    def _finish(self, reason: str, rewards: dict[str, float], truncated: bool = False) -> None:
        self.end_reason = reason
        self.rewards = {a: float(rewards[a]) for a in self.agents}
        done = self.truncations if truncated else self.terminations
        for a in self.agents:
            done[a] = True
        self.agent_selection = self._agent_selector.next()

    # -- observations ------------------------------------------------------------------

    def observe(self, agent: str) -> dict:
        seat = self._seat[agent]
        texts = {
            "rules": ascii_text(self.game.rules),
            "state": ascii_text(self.state_text(agent)),
            "view": ascii_text(self.game.describe(seat)),
        }
        for part, text in texts.items():
            if len(text) > MAX_TEXT_LENGTH:  # outside the observation space, and more than any prompt should hold
                raise UserError(
                    f"Game '{self.metadata['name']}' is too large to prompt: its {part} text for {agent} at turn "
                    f"{self.turns} is {len(text):,} characters, more than an observation holds ({MAX_TEXT_LENGTH:,}). "
                    "Choose smaller game parameters."
                )
        return {"observation": np.asarray(self.game.observation_tensor(seat), dtype=np.float32), **texts}

    def state_text(self, agent: str) -> str:
        seat = self._seat[agent]
        parts = [f"You are {agent}.", self.game.describe(seat)]
        if self.end_reason is not None:
            parts.append("The game is over.")
        elif seat == self.game.current_player():
            if self._feedback:
                parts.append(self._feedback)
            parts.append(self.game.moves_prompt())
            parts.append(self.game.answer_format.instruction(self.legal_moves()[0]))
        else:
            parts.append(f"Waiting for {self.possible_agents[self.game.current_player()]} to move.")
        return "\n\n".join(parts)

    # -- helpers for agents ----------------------------------------------------------------

    def role(self, agent: str) -> str:
        """The role `agent` plays (see `TextGame.roles`)."""
        return self.game.roles[self._seat[agent]] if self.game.roles else agent

    def legal_moves(self) -> list[str]:
        """The mover's legal moves, computed once per state (the game changes only through step)."""
        if self._legal_moves is None:
            self._legal_moves = self.game.legal_moves()
        return self._legal_moves

    def answer(self, move: str) -> str:
        """`move` written in the game's answer format, as a model should write it."""
        return self.game.answer_format.wrap(move)

    def parse(self, text: str) -> str | None:
        """The legal move that `text` names, or None."""
        return self._read_move(text)[0]

    def render(self) -> str | None:
        if self.render_mode is None:
            gymnasium.logger.warn("render() called without a render_mode; pass render_mode='ansi' or 'human'.")
            return None
        text = self.state_text(self.agent_selection)
        if self.render_mode == "human":
            print(text)
            return None
        return text

    def close(self) -> None:
        pass


def _output_text(action: object) -> str:
    return action.text if isinstance(action, UnfinishedOutput) else str(action)


def _excerpt(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def ascii_text(text: str) -> str:
    """`text` in the Text spaces' charset (printable ASCII): box drawing as -, | and +, playing
    cards as rank and suit (AS, TH), suits and arrows as letters and arrows, accented letters
    without their accents, and any other symbol by its Unicode name, so that nothing is lost."""
    text = _ANSI_ESCAPE.sub("", text)
    if not _OUTSIDE_CHARSET.search(text):
        return text
    return "".join(ch if ch in _TEXT_SPACE_CHARSET else _ascii_symbol(ch) for ch in text)


def _ascii_symbol(ch: str) -> str:
    if ch in _SYMBOLS:
        return _SYMBOLS[ch]
    name = unicodedata.name(ch, f"U+{ord(ch):04X}")
    if name.startswith("BOX DRAWINGS"):
        return _box_drawing(name)
    if name.startswith("PLAYING CARD "):
        rank, _, suit = name.removeprefix("PLAYING CARD ").partition(" OF ")
        return _CARD_RANKS.get(rank, rank.lower()) + suit[:1] if suit else f"[{rank.lower()}]"
    plain = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode()
    if plain and not _OUTSIDE_CHARSET.search(plain):
        return plain
    return f"[{name.lower()}]"


def _box_drawing(name: str) -> str:
    if "DIAGONAL" in name:
        return "X" if "CROSS" in name else "/" if "UPPER RIGHT TO LOWER LEFT" in name else "\\"
    across = any(word in name for word in ("HORIZONTAL", "LEFT", "RIGHT"))
    upright = any(word in name for word in ("VERTICAL", "UP", "DOWN"))
    return "+" if across and upright else "-" if across else "|"
