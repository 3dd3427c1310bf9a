"""Transcripts: what each model wrote in a game, turn by turn, and how the game read it.

A transcript is made from the records every game already yields (`Trajectory`: the result and
each language-model `Turn`), so it holds every turn a model took, in order: the raw text it
wrote, the answer the game read from it or why it was invalid, and optionally the prompt it was
shown (decoded from the prompt's tokens: exactly what the model saw). Scripted agents write no
text, and their moves are not recorded; a game between models has each of its moves here.
`selfplay play` and `selfplay eval` save them as JSON lines (`--transcripts`), one game a line,
published whole when the command ends and not at all if it stops (`files.published`);
`selfplay play --show` prints them (`format_transcript`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from types import MappingProxyType

from selfplay.files import published
from selfplay.games import make_game
from selfplay.games.answers import AnswerFormat
from selfplay.records import Trajectory
from selfplay.rollouts import Player

NO_NAMES: Mapping[str, str] = MappingProxyType({})
ENDINGS = {"game_over": "played to the end", "invalid_move": "ended by an invalid move", "turn_cap": "truncated"}


def transcript(
    trajectory: Trajectory, players: Mapping[str, Player], names: Mapping[str, str] = NO_NAMES, prompts: bool = False
) -> dict:
    """The transcript of one game (a JSON object): the game, its seed, the players by seat (as
    `names` renames their labels), how it ended, and each model turn in order; with `prompts`,
    each turn's prompt, decoded by the tokenizer of its player in `players`."""
    result = trajectory.result
    answer_format = _answer_format(result.game)
    turns = []
    for turn in trajectory.turns:
        record = {
            "seat": turn.seat,
            "role": turn.role,
            "agent": names.get(turn.agent, turn.agent),
            "text": turn.text,
            "finish_reason": turn.finish_reason,
            "invalid": turn.invalid,
            # A valid turn's answer is the move the game read; an invalid one says why it was refused.
            **(
                {"invalid_reason": turn.invalid_reason}
                if turn.invalid
                else {"answer": answer_format.extract(turn.text)}
            ),
        }
        if prompts:
            record["prompt"] = players[turn.agent].tokenizer.decode(list(turn.prompt_ids))
        turns.append(record)
    return {
        "game": result.game,
        "seed": result.seed,
        "players": [names.get(label, label) for label in result.players],
        "rewards": list(result.rewards),
        "end_reason": result.end_reason,
        "moves": result.turns,
        "turns": turns,
    }


@cache
def _answer_format(game: str) -> AnswerFormat:
    return make_game(game).answer_format


def format_transcript(record: dict) -> str:
    """A transcript (`transcript`) as readable lines: the game and how it ended, then each model
    turn, what it wrote (its prompt before it, where the record has it) and how the game read it."""
    seats = ", ".join(f"seat {seat} {name}" for seat, name in enumerate(record["players"]))
    returns = ", ".join(f"{reward:+g}" for reward in record["rewards"])
    ending = ENDINGS.get(record["end_reason"], record["end_reason"])
    moves = f"{record['moves']} move{'s' * (record['moves'] != 1)}"
    lines = [f"{record['game']}, seed {record['seed']}: {seats}; {ending} after {moves}; returns {returns}"]
    for turn in record["turns"]:
        who = f"seat {turn['seat']} {turn['agent']}"
        if "prompt" in turn:
            lines += [f"  {who} was shown:", _quoted(turn["prompt"], "    | ")]
        read = f"invalid: {turn['invalid_reason']}" if turn["invalid"] else f"read as {turn['answer']!r}"
        lines += [f"  {who} wrote ({read}):", _quoted(turn["text"], "    > ")]
    if not record["turns"]:
        lines.append("  (no model played: only models' turns are recorded)")
    return "\n".join(lines)


def _quoted(text: str, mark: str) -> str:
    """`text` with `mark` before each of its lines, blank ones too (so that an empty text shows)."""
    return "\n".join(mark + line for line in text.split("\n"))


@contextmanager
def transcript_file(path: str | Path | None) -> Iterator[Callable[[dict], None] | None]:
    """A function that writes one transcript to `path` as a line of JSON, as games end (None for
    no `path`): the file is published whole when the block ends, and nothing is left if it
    raises (an interrupt)."""
    if path is None:
        yield None
        return
    with published(path, "the transcripts") as partial, partial.open("w", encoding="utf-8", buffering=1) as stream:
        yield lambda record: stream.write(json.dumps(record, ensure_ascii=False) + "\n")
