"""Text games as PettingZoo AEC environments: the protocol, native games and adapters."""

from selfplay.games.answers import BOXED, AnswerFormat
from selfplay.games.base import InvalidMovePolicy, TextGame, TextGameEnv, UnfinishedOutput
from selfplay.games.registry import UnknownGameError, describe_games, make_env, make_game

__all__ = [
    "BOXED",
    "AnswerFormat",
    "InvalidMovePolicy",
    "TextGame",
    "TextGameEnv",
    "UnfinishedOutput",
    "UnknownGameError",
    "describe_games",
    "make_env",
    "make_game",
]
