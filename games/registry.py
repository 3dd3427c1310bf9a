"""Finding games by spec.

A game spec is one of:

- `NAME` or `NAME(key=value, ...)`: a native game, or one a package registers under the
  `selfplay.games` entry-point group (the entry point names a `TextGame` subclass or any
  callable that takes the spec's keyword arguments and returns a `TextGame`);
- `openspiel:NAME` or `openspiel:NAME(key=value, ...)`: any turn-based OpenSpiel game of two
  or more players, with OpenSpiel's own game parameters;
- `pettingzoo:MODULE` or `pettingzoo:MODULE(key=value, ...)`: any PettingZoo environment
  with discrete actions, AEC or parallel, for example `pettingzoo:pettingzoo.classic.connect_four_v3`
  (`pettingzoo:MODULE.FACTORY` names the function that makes it).
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
import sys
from collections.abc import Callable
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
    "secret_keeping": "selfplay.games.secret_keeping:SecretKeeping",
    "proposer_solver": "selfplay.games.proposer_solver:ProposerSolver",
    "arithmetic": "selfplay.games.arithmetic:Arithmetic",
}

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


def registered_games() -> dict[str, Callable[[], Callable[..., TextGame]]]:
    """Every game name, native first, mapped to a loader of its factory."""
    games: dict[str, Callable[[], Callable[..., TextGame]]] = {
        name: (lambda target=target: _load(target)) for name, target in NATIVE_GAMES.items()
    }
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        games.setdefault(ep.name, lambda ep=ep: _load_entry_point(ep))
    return games


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
            raise UnknownGameError(f"Unknown game '{name}'. {_spec_help()}")
        factory = games[name]()
    try:
        return factory(**params)
    except TypeError as err:
        raise UnknownGameError(f"Game '{name}' does not take the parameters {params}: {err}") from None


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
        f"turn-based OpenSpiel games of two or more players, pettingzoo:MODULE for PettingZoo "
        f"environments with discrete actions. Run `selfplay games list` for details."
    )
