"""OpenSpiel games as text games.

`OpenSpielGame` runs an OpenSpiel state machine behind the `TextGame` protocol: chance nodes
are sampled by the environment's generator, the text comes from OpenSpiel's own observation
or information-state strings and action names, the rules from `openspiel_rules`. It serves
directly as the `openspiel:NAME` adapter, for any game of two or more players, turn-based or
with simultaneous moves (played through OpenSpiel's own turn-based conversion, which shows no
player another's choice of a round before the round is complete);
native games subclass it to write their own rules, state text and move names while keeping an
exact OpenSpiel twin, which search and solver agents (MCTS, CFR) and exploitability use.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import pyspiel

from selfplay.errors import UserError
from selfplay.games.base import MAX_TEXT_LENGTH, TextGame, ascii_text
from selfplay.games.openspiel_rules import rules_for, utility_kind
from selfplay.games.registry import check_parameters

# The ante that Kuhn Poker and Leduc Hold'em take from each player; they have no blinds.
ANTE_GAMES = {"kuhn_poker": 1.0, "leduc_poker": 1.0}
# Bounds on what one state of a game may hold, checked before OpenSpiel allocates it: the moves
# (and chance outcomes) one state can list, and the numbers in one observation tensor. Parameters
# past them (nim with a pile of 10^8) would fill the machine's memory before the first move.
MAX_ACTIONS = 1_000_000
MAX_OBSERVATION_VALUES = 1_000_000
_STDERR_HELD = threading.Lock()


def poker_big_blind(game: pyspiel.Game) -> float | None:
    """The chips of one big blind in an OpenSpiel poker game played one hand a game, or None for
    any other game (OpenSpiel's game type does not mark poker, so its poker games are named).

    Kuhn Poker and Leduc Hold'em have an ante of 1 chip each and no blinds; as in the papers that
    report them in milli-big-blinds per hand, the ante counts as 1 big blind. `universal_poker`
    names its blinds per player: the largest is the big blind. `repeated_poker` and
    `repeated_leduc_poker` return the chips of a whole session of hands, so they get None."""
    name = game.get_type().short_name
    if name in ANTE_GAMES:
        return ANTE_GAMES[name]
    if name == "universal_poker":
        return float(max(int(blind) for blind in str(game.get_parameters()["blind"]).split()))
    return None


class OpenSpielGame(TextGame):
    """Any OpenSpiel game of two or more players, turn-based or simultaneous-move, rendered from
    OpenSpiel's own strings."""

    def __init__(self, name: str, **params):
        # Checked here, as OpenSpiel prints to the terminal whatever it refuses (every game's name).
        if name not in pyspiel.registered_names():
            raise UserError(f"OpenSpiel has no game '{name}' (pyspiel.registered_names() lists its games).")
        try:
            with native_errors_held():
                game = pyspiel.load_game(name, _checked_parameters(name, params))
                _check_size(game)
                simultaneous = game.get_type().dynamics == pyspiel.GameType.Dynamics.SIMULTANEOUS
                # The game as OpenSpiel defines it, where its moves are simultaneous (its rules and names come
                # from it); `spiel_game`, what is played, is then OpenSpiel's own turn-based form of it.
                self.simultaneous_game: pyspiel.Game | None = game if simultaneous else None
                self.spiel_game = pyspiel.convert_to_turn_based(game) if simultaneous else game
                self.state: pyspiel.State = self.spiel_game.new_initial_state()
        except (pyspiel.SpielError, IndexError) as err:  # IndexError: a C++ lookup of a setting it lacks (nfg_game)
            raise UserError(f"OpenSpiel cannot load '{name}' with {params}: {err}") from None
        kind = self.spiel_game.get_type()
        if self.spiel_game.num_players() < 2:
            raise UserError(
                f"OpenSpiel game '{name}' has {self.spiel_game.num_players()} player; self-play needs 2 or more."
            )
        if kind.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
            raise UserError(
                f"OpenSpiel game '{name}' is a {kind.dynamics.name.lower().replace('_', '-')} game; self-play plays "
                "turn-based and simultaneous-move games."
            )
        self.num_players = self.spiel_game.num_players()
        self.zero_sum = kind.utility == pyspiel.GameType.Utility.ZERO_SUM
        self.cooperative = kind.utility == pyspiel.GameType.Utility.IDENTICAL
        self.judged_by_return = kind.chance_mode != pyspiel.GameType.ChanceMode.DETERMINISTIC
        self.big_blind = poker_big_blind(self.spiel_game)
        self._perfect_information = kind.information == pyspiel.GameType.Information.PERFECT_INFORMATION
        self._tensor, self.observation_shape = _observation_tensor(self.spiel_game)
        self.max_length = self.spiel_game.max_game_length()
        self._rng = np.random.default_rng(0)  # until `reset` hands the game its generator
        self._check_promptable()
        self.rules = self.rules_text()

    @property
    def defined_game(self) -> pyspiel.Game:
        """The game as OpenSpiel defines it: `spiel_game`, or the simultaneous-move game it plays in turns."""
        return self.simultaneous_game or self.spiel_game

    # -- the state machine ---------------------------------------------------------------

    def reset(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self.state = self.spiel_game.new_initial_state()
        self._play_chance()

    def reset_to(self, history: Sequence[int]) -> None:
        """Start an episode at the state OpenSpiel reaches by playing `history` (chance outcomes
        included) from the initial state; chance nodes after it are sampled as in `reset`."""
        self.state = self.spiel_game.new_initial_state()
        for action in history:
            self.state.apply_action(action)
        self._play_chance()

    def _play_chance(self) -> None:
        while self.state.is_chance_node():
            if not self.state.chance_outcomes():
                raise UserError(f"OpenSpiel's '{self.defined_game}' deals nothing at these parameters: choose others.")
            actions, probs = zip(*self.state.chance_outcomes())
            self.state.apply_action(actions[self._rng.choice(len(actions), p=probs)])

    def current_player(self) -> int:
        return self.state.current_player()

    def legal_actions(self) -> list[int]:
        return self.state.legal_actions()

    def legal_moves(self) -> list[str]:
        return [self.move_name(a) for a in self.state.legal_actions()]

    def move_name(self, action: int) -> str:
        """The canonical move name of an OpenSpiel action for the current player, in ASCII as the
        prompt shows it (bridge's 1♣ is 1C)."""
        return ascii_text(self._spiel_text(self.state.action_to_string, self.state.current_player(), action))

    def _spiel_text(self, method, *args) -> str:
        """What an OpenSpiel text method returns, or a UserError where it writes bytes that are not
        UTF-8 (as some games' boards do past 26 columns or rows)."""
        try:
            return method(*args)
        except UnicodeDecodeError as err:
            raise UserError(
                f"OpenSpiel's '{self.defined_game}' writes text that is not UTF-8 ({bytes(err.object[:24])!r}...), so "
                "no player could read its state or moves. Its text is broken at these parameters: choose smaller ones."
            ) from None

    def _check_promptable(self) -> None:
        """Deal a first state and read what a prompt would show of it (each player's view and the
        mover's legal moves), so that a game OpenSpiel cannot write, or whose first state is too long
        to prompt, is refused before anything is played or written."""
        self._play_chance()
        if self.state.is_terminal():
            raise UserError(
                f"OpenSpiel's '{self.defined_game}' is over before anyone moves (its first state is terminal): "
                "there is nothing to play. Choose other parameters."
            )
        try:
            views = [len(self._view(player)) for player in range(self.num_players)]
            mover = self.state.current_player()
            names = [self._spiel_text(self.state.action_to_string, mover, a) for a in self.state.legal_actions()]
        finally:
            self.state = self.spiel_game.new_initial_state()
        longest = max(views) + sum(len(name) + 2 for name in names)  # listed as "a, b, ..."
        if longest > MAX_TEXT_LENGTH:
            raise UserError(
                f"OpenSpiel's '{self.defined_game}' is too large to prompt: its first state's view and legal moves "
                f"take {longest:,} characters, more than an observation holds ({MAX_TEXT_LENGTH:,}). Choose "
                "smaller parameters."
            )

    def action_of(self, move: str) -> int:
        for action in self.state.legal_actions():
            if self.move_name(action) == move:
                return action
        raise ValueError(f"'{move}' is not a legal move")

    def apply(self, move: str) -> None:
        self.state.apply_action(self.action_of(move))
        self._play_chance()

    def is_over(self) -> bool:
        return self.state.is_terminal()

    def returns(self) -> list[float]:
        return list(self.state.returns())

    def observation_tensor(self, player: int) -> np.ndarray:
        if self._tensor == "observation":
            values = self.state.observation_tensor(player)
        elif self._tensor == "information_state":
            values = self.state.information_state_tensor(player)
        else:
            values = [self.state.move_number()]
        return np.asarray(values, dtype=np.float32).reshape(self.observation_shape)

    # -- text -----------------------------------------------------------------------------

    def rules_text(self) -> str:
        """The rules shown to every player: what OpenSpiel says of the game, its objective and how
        moves are written (`openspiel_rules`); native games write their own."""
        game = self.defined_game
        kind = game.get_type()
        info = "imperfect information"
        if kind.information == pyspiel.GameType.Information.PERFECT_INFORMATION:
            # OpenSpiel's word for a simultaneous game whose choices are all shown once made.
            info = "perfect information of past rounds" if self.simultaneous_game else "perfect information"
        order = (
            "its moves are simultaneous: each round every player chooses a move in turn, player 0 first, and no "
            "player sees another's choice of that round until all have chosen"
            if self.simultaneous_game
            else "player 0 moving first"
        )
        rules = rules_for(game)
        return (
            f"You are playing {kind.long_name} (OpenSpiel game '{game}'), a {utility_kind(game)} game for "
            f"{self.num_players} players with {info}, {order}; a game lasts at most "
            f"{self.max_length} moves.\nObjective: {rules.objective}\nHow a move is written: {rules.moves} "
            f"Each turn you see the state as OpenSpiel draws it and your legal moves; answer with one of them."
        )

    def describe(self, player: int) -> str:
        sides = rules_for(self.defined_game).sides
        side = f", playing {sides[player]}" if player < len(sides) else ""
        return (
            f"You are player {player} of {self.num_players}{side}.\nCurrent state (as OpenSpiel writes it):\n"
            f"{self._view(player)}"
        )

    def _view(self, player: int) -> str:
        """The state as OpenSpiel writes it for `player`."""
        kind = self.spiel_game.get_type()
        if (
            self._perfect_information or not kind.provides_information_state_string
        ) and kind.provides_observation_string:
            return self._spiel_text(self.state.observation_string, player)
        return self._spiel_text(self.state.information_state_string, player)


def _checked_parameters(name: str, params: dict) -> dict:
    """`params` checked against the parameters OpenSpiel's game `name` takes (their names, and the
    type of each default), a whole number given for a real-valued parameter made the float that
    OpenSpiel requires."""
    if not params:
        return params
    game = pyspiel.load_game(name)
    # Hanabi states its parameters only in its specification.
    defaults = {**game.get_parameters(), **game.get_type().parameter_specification}
    accepted = {
        key: inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=value, annotation=type(value))
        for key, value in defaults.items()
    }
    check_parameters(f"OpenSpiel game '{name}'", params, accepted)
    return {key: float(value) if type(defaults[key]) is float else value for key, value in params.items()}


@contextlib.contextmanager
def native_errors_held() -> Iterator[None]:
    """Hold what OpenSpiel's C++ code writes to the process's stderr inside the block: it prints
    each error before raising it as a SpielError, whose message says the same. Written out after
    a block that succeeds; dropped when the block raises, leaving the one message made from it."""
    sys.stderr.flush()
    with _STDERR_HELD, tempfile.TemporaryFile() as held:  # one block at a time: fd 2 is the whole process's
        stderr = os.dup(2)
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(stderr, 2)
            os.close(stderr)
        held.seek(0)
        sys.stderr.write(held.read().decode(errors="replace"))


def _check_size(game: pyspiel.Game) -> None:
    """Refuse a game whose states would list more moves or chance outcomes, or whose observations
    hold more numbers, than the bounds above, with the size it asked for."""
    sizes = {
        "distinct moves": (game.num_distinct_actions(), MAX_ACTIONS),
        "chance outcomes at one node": (game.max_chance_outcomes(), MAX_ACTIONS),
        "numbers in an observation tensor": (math.prod(_observation_tensor(game)[1]), MAX_OBSERVATION_VALUES),
    }
    for what, (size, bound) in sizes.items():
        if size > bound:
            raise UserError(
                f"OpenSpiel's '{game}' is too large to play: it has {size:,} {what}, more than {bound:,}. "
                "Choose smaller parameters."
            )


def _observation_tensor(game: pyspiel.Game) -> tuple[str | None, tuple[int, ...]]:
    """The tensor a player observes the game by ("observation", "information_state", or None for a
    game that provides neither, observed by its move number) and its shape."""
    kind = game.get_type()
    if kind.provides_observation_tensor:
        return "observation", tuple(game.observation_tensor_shape())
    if kind.provides_information_state_tensor:
        return "information_state", tuple(game.information_state_tensor_shape())
    return None, (1,)
