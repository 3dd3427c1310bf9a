"""The records that flow between the parts of selfplay.

Plain frozen data (ints, floats, strings and tuples of them), so that rollout workers, the
learner and the league can exchange them across processes and machines.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class MatchResult:
    """One finished game: who sat where and how it ended."""

    game: str
    seed: int
    players: tuple[str, ...]  # agent label per seat
    rewards: tuple[float, ...]  # final reward per seat
    invalid_moves: tuple[int, ...]  # invalid outputs per seat
    turns: int  # valid moves played
    end_reason: str  # "game_over", "invalid_move" or "turn_cap"
    owner: str | None = None  # the learning player that trains on this game (`MatchSpec.owner`)
    # per seat, the game's named figures of what its role did (`TextGame.outcome_figures`)
    figures: tuple[tuple[tuple[str, float], ...], ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Turn:
    """One move written by a language-model policy: what the learner trains on."""

    game: str
    match_seed: int  # identifies the game this turn belongs to, with `game`
    seat: int
    role: str  # the role the seat plays, e.g. "player_0" or "solver" (TextGameEnv.role)
    agent: str  # label of the policy that played the seat
    policy_version: int  # version of the weights that sampled the response
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # the sampler's log-probability of each response token
    text: str
    finish_reason: str  # "stop" or "length"
    invalid: bool  # the response named no legal move (or was cut off)
    reward: float  # reward the environment gave this seat right after this move
    choices: tuple[tuple[int, ...], ...] = ()  # legal decoding's legal answers (token ids); () if sampled freely
    grammar: str = ""  # structured decoding's grammar of the answer (EBNF); "" if sampled freely
    # An invalid output the game let its player retry: the penalty it would have ended the game
    # with, which scores this turn in place of the seat's final return (it did not lead to it).
    retried_penalty: float | None = None
    invalid_reason: str = ""  # why the game refused the response (its `invalid_log` entry); "" if valid


@dataclass(frozen=True)
class Trajectory:
    """A finished game with every language-model turn played in it, in order."""

    result: MatchResult
    turns: tuple[Turn, ...]
