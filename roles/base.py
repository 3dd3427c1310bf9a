"""What a role is, and the registry of roles.

A role is what a seat of an environment is asked to do, independent of the seat: the
proposer of a task, one of several solvers, the attacker of a secret. It carries

- `instructions`: the prompt template its player sees, filled by the environment with
  `str.format` fields (the task, the conversation so far, ...);
- `reward`: how its reward follows from the environment's outcome (a mapping of named
  quantities the environment measures, such as a solver's success rate);
- `advantage_key`: the key its turns' advantages are grouped by; by default (environment,
  role), so every seat playing a role shares one baseline in each environment.

Adding a role: define a `Role`, `register` it, and have the environment name it in
`TextGame.roles` for the seats that play it and compute its rewards with `role.reward`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

from selfplay.records import Turn

Outcome = Mapping[str, float]


def game_and_role(turn: Turn) -> tuple[str, str]:
    """The default advantage key: one baseline per role in each game (environment)."""
    return (turn.game, turn.role)


@dataclass(frozen=True)
class Role:
    name: str
    instructions: str
    reward: Callable[[Outcome], float]
    advantage_key: Callable[[Turn], Hashable] = field(default=game_and_role)


ROLES: dict[str, Role] = {}


def register(role: Role) -> Role:
    """Make `role`'s advantage key the one its turns are grouped by. Environments may build a
    role with their own parameters (a reward scheme, a penalty); roles of one name share one key."""
    ROLES[role.name] = role
    return role


def advantage_key(turn: Turn) -> Hashable:
    """The advantage key of a turn: its registered role's, else (environment, role)."""
    role = ROLES.get(turn.role)
    return role.advantage_key(turn) if role is not None else game_and_role(turn)
