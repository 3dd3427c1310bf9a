"""Finding games by spec.

A game spec is one of:

- `NAME` or `NAME(key=value, ...)`: a native game, or one a package registers under the
  `selfplay.games` entry-point group (the entry point names a `TextGame` subclass or any
  callable that takes the spec's keyword arguments and returns a `TextGame`). selfplay's own
  role games (in `roles/`, built on this package) register that way too, in pyproject.toml, so
  that `games/` never imports `roles/`;
- `openspiel:NAME` or `openspiel:NAME(key=value, ...)`: any OpenSpiel game of two or more
  players with OpenSpiel's own game parameters, turn-based or with simultaneous moves (played
  through OpenSpiel's turn-based conversion);
- `pettingzoo:MODULE` or `pettingzoo:MODULE(key=value, ...)`: any PettingZoo environment
  with discrete actions, AEC or parallel, for example `pettingzoo:pettingzoo.classic.connect_four_v3`
  (`pettingzoo:MODULE.FACTORY` names the function that makes it).
"""

from __future__ import annotations

import ast
import collections.abc
import functools
import importlib
import inspect
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping
from importlib.metadata import EntryPoint, entry_points

from selfplay.errors import UserError
from selfplay.games.base import InvalidMovePolicy, TextGame, TextGameEnv

ENTRY_POINT_GROUP = "selfplay.games"

NATIVE_GAMES: dict[str, str] = {
    "tictactoe": "selfplay.games.tictactoe:TicTacToe",
    "connect_four": "selfplay.games.connect_four:ConnectFour",
    "kuhn_poker": "selfplay.games.kuhn_poker:KuhnPoker",
    "leduc_holdem": "selfplay.games.leduc_holdem:LeducHoldem",
    "liars_dice": "selfplay.games.liars_dice:LiarsDice",
    "nim": "selfplay.games.nim:Nim",
    "negotiation": "selfplay.games.negotiation:SimpleNegotiation",
}
# The distribution whose entry-point games are built in rather than a plugin's.
PACKAGE = "selfplay"

ADAPTERS: dict[str, str] = {
    "openspiel": "selfplay.games.openspiel_game:OpenSpielGame",
    "pettingzoo": "selfplay.games.pettingzoo_game:PettingZooGame",
}

_SPEC = re.compile(r"^\s*(?:(?P<adapter>\w+):)?(?P<name>[\w.\-]+)\s*(?:\((?P<params>.*)\))?\s*$")


class UnknownGameError(UserError):
    """A game spec names no game; the message lists what exists."""


def _load(target: str) -> Callable[..., TextGame]:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _is_builtin(ep: EntryPoint) -> bool:
    return ep.dist is not None and ep.dist.name == PACKAGE


def _game_entry_points() -> tuple[tuple[EntryPoint, bool], ...]:
    """The game entry points installed on the current import path, each with whether this
    package registers it, built-in first."""
    return _entry_points_on(tuple(sys.path))


@functools.lru_cache(maxsize=8)
def _entry_points_on(path: tuple[str, ...]) -> tuple[tuple[EntryPoint, bool], ...]:
    # Read once per import path: reading them parses every installed package's metadata (15 ms
    # and more), and a rollout makes a game for each match it starts.
    found = [(ep, _is_builtin(ep)) for ep in entry_points(group=ENTRY_POINT_GROUP)]
    return tuple(sorted(found, key=lambda entry: not entry[1]))


def registered_games() -> dict[str, Callable[[], Callable[..., TextGame]]]:
    """Every game name, built-in first (native, then this package's entry points), mapped to a
    loader of its factory."""
    games: dict[str, Callable[[], Callable[..., TextGame]]] = {
        name: (lambda target=target: _load(target)) for name, target in NATIVE_GAMES.items()
    }
    for ep, _ in _game_entry_points():
        games.setdefault(ep.name, lambda ep=ep: _load_entry_point(ep))
    return games


def builtin_games() -> list[str]:
    """The names of this package's own games: the native ones, then the role games it registers
    as entry points."""
    return [*NATIVE_GAMES, *(ep.name for ep in _builtin_entry_points())]


def _builtin_entry_points() -> list[EntryPoint]:
    return [ep for ep, builtin in _game_entry_points() if builtin]


def _stale_install_warning() -> str | None:
    """What to do when this package's installed metadata names none of its entry-point games
    (installed before they moved there, or not installed at all), else None."""
    if _builtin_entry_points():
        return None
    return (
        "selfplay's installed package metadata registers none of its role games (secret keeping, "
        f"proposer/solver, ...: entry-point group {ENTRY_POINT_GROUP}); run `pip install -e .` in the "
        "selfplay source tree to register them."
    )


class BrokenPluginError(UserError):
    """A package's game entry point cannot be loaded."""


def _load_entry_point(ep: EntryPoint) -> Callable[..., TextGame]:
    try:
        return ep.load()
    except Exception as err:  # a third-party package can fail in any way; the rest of the registry must not
        raise BrokenPluginError(
            f"The game '{ep.name}' that a package registers ({ep.value}, entry-point group {ENTRY_POINT_GROUP}) "
            f"cannot be loaded: {type(err).__name__}: {err}. Reinstall or fix that package."
        ) from None


def parse_spec(spec: str) -> tuple[str | None, str, dict]:
    """Split a spec into (adapter or None, name, keyword parameters)."""
    match = _SPEC.match(spec)
    if match is None:
        raise UnknownGameError(f"'{spec}' is not a game spec. {_spec_help()}")
    params = {}
    if match["params"] and match["params"].strip():
        for item in _split_top_level(match["params"]):
            key, sep, value = item.partition("=")
            if not sep or not key.strip().isidentifier():
                raise UnknownGameError(f"'{item.strip()}' in '{spec}' is not key=value. {_spec_help()}")
            params[key.strip()] = _parse_value(value.strip())
    return match["adapter"], match["name"], params


def _split_top_level(text: str) -> list[str]:
    items, depth, current = [], 0, []
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    items.append("".join(current))
    return [item for item in items if item.strip()]


def _parse_value(text: str) -> object:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def make_game(spec: str) -> TextGame:
    """The `TextGame` a spec names; raises UnknownGameError listing the choices."""
    adapter, name, params = parse_spec(spec)
    if adapter is not None:
        if adapter not in ADAPTERS:
            raise UnknownGameError(f"Unknown adapter '{adapter}:' in '{spec}'. {_spec_help()}")
        return _load(ADAPTERS[adapter])(name, **params)
    if name in NATIVE_GAMES:  # found without scanning every installed package's entry points
        factory = _load(NATIVE_GAMES[name])
    else:
        games = registered_games()
        if name not in games:
            stale = _stale_install_warning()
            raise UnknownGameError(f"Unknown game '{name}'. {stale + ' ' if stale else ''}{_spec_help()}")
        factory = games[name]()
    check_parameters(f"Game '{name}'", params, _signature(factory).parameters)
    try:
        return factory(**params)
    except TypeError as err:  # a factory that states no types of its own, given a value it cannot use
        raise UserError(f"Game '{name}' cannot use the values {params}: {err}. Check each value's type.") from None


def _signature(factory: Callable[..., TextGame]) -> inspect.Signature:
    """The factory's signature, its annotations evaluated where they can be (a name imported only
    for type checkers leaves them as text, which `check_parameters` does not read)."""
    try:
        return inspect.signature(factory, eval_str=True)
    except NameError:
        return inspect.signature(factory)


def check_parameters(game: str, params: Mapping[str, object], accepted: Mapping[str, inspect.Parameter]) -> None:
    """Raise a UserError naming the first of `params` that `game` (e.g. "Game 'nim'") has no
    parameter for, or whose value is not of the type its parameter states. A `**kwargs`
    parameter takes any name, left to the game to check."""
    named = [p.name for p in accepted.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    open_ended = any(p.kind == p.VAR_KEYWORD for p in accepted.values())
    for key, value in params.items():
        if key not in named:
            if open_ended:
                continue
            raise UserError(f"{game} has no parameter '{key}'; its parameters: {', '.join(named) or 'none'}.")
        parameter = accepted[key]
        if not _fits(value, parameter.annotation):
            default = parameter.default
            example = f" (its default: {key}={spec_text(default)})" if default not in (parameter.empty, None) else ""
            raise UserError(
                f"{game}: parameter '{key}' takes {_type_words(parameter.annotation)}, not {value!r}{example}."
            )


# How a spec writes a value of each type, for messages.
_TYPE_WORDS = {int: "a whole number", float: "a number", bool: "true or false", str: "text", type(None): "None"}


def _fits(value: object, annotation: object) -> bool:
    """Whether a spec's value is of the type an annotation states: int, float (an int too), bool,
    str, None, unions and lists or sequences of them. Any other annotation (a class of the game's
    own, text left unevaluated, none) is left to the game, which sees the value as given."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in args)
    if annotation is None or annotation is type(None):
        return value is None
    if annotation is float:
        return type(value) in (int, float)
    if annotation in (int, bool, str):
        return type(value) is annotation
    if origin in (list, collections.abc.Sequence) and args:
        return isinstance(value, list | tuple) and all(_fits(item, args[0]) for item in value)
    return True


def _type_words(annotation: object) -> str:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " or ".join(_type_words(arg) for arg in typing.get_args(annotation))
    if annotation in _TYPE_WORDS:
        return _TYPE_WORDS[annotation]
    if typing.get_origin(annotation) in (list, collections.abc.Sequence) and typing.get_args(annotation):
        return f"a list ({_type_words(typing.get_args(annotation)[0])} each)"
    return re.sub(r"\b[\w.]+\.(?=\w)", "", str(annotation))  # typing.Literal['a'] as Literal['a']


def spec_text(value: object) -> str:
    """`value` as a game spec writes it: true and false in lower case, text unquoted."""
    return str(value).lower() if isinstance(value, bool) else str(value) if isinstance(value, str) else repr(value)


@functools.cache
def is_cooperative(spec: str) -> bool:
    """Whether every seat of the game shares one score (a team game, reported by that score)."""
    return make_game(spec).cooperative


def make_env(
    spec: str,
    *,
    invalid_moves: InvalidMovePolicy = InvalidMovePolicy(),
    max_turns: int | None = None,
    render_mode: str | None = None,
) -> TextGameEnv:
    """A PettingZoo AEC environment for the game a spec names."""
    return TextGameEnv(
        make_game(spec), name=spec.strip(), invalid_moves=invalid_moves, max_turns=max_turns, render_mode=render_mode
    )


def describe_games() -> list[tuple[str, str]]:
    """(name, one-line description) of every registered game; a package's game that cannot be
    loaded is left out with a warning naming it."""
    stale = _stale_install_warning()
    if stale:
        print(f"warning: {stale}", file=sys.stderr)
    rows = []
    for name, loader in registered_games().items():
        try:
            doc = (loader().__doc__ or "").strip()
        except BrokenPluginError as err:
            print(f"warning: left out of the game list: {err}", file=sys.stderr)
            continue
        rows.append((name, doc.splitlines()[0] if doc else ""))
    return rows


def _spec_help() -> str:
    return (
        f"Games: {', '.join(registered_games())}. Adapters: openspiel:NAME[(key=value,...)] for "
        f"OpenSpiel games of two or more players (turn-based or simultaneous), pettingzoo:MODULE for PettingZoo "
        f"environments with discrete actions. Run `selfplay games list` for details."
    )
