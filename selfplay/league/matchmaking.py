"""Matchmaking: who a learning player meets in each seat it does not take.

A learning player's opponents come from a mix of rules, each drawn by its weight:

- `self`: its own current policy (SPIRAL's setting: latest self only);
- `main`: the current main player (what a main exploiter hunts);
- `uniform`: uniform over the past players (the league's frozen snapshots);
- `pfsp:WEIGHTING`: prioritized fictitious self-play over the past players, each weighted by
  f(p) where p is the learner's (decayed) win rate against it, draws counting half:
  `hard` (1 - p)^2 focuses on the players it loses to, `variance` p (1 - p) on even matches,
  `linear_capped` min(0.5, 1 - p) on all it has not mastered (AlphaStar);
- `psro:SOLVER`: the population's meta-strategy (PSRO), each past player drawn with the
  probability that the meta-solver SOLVER (`nash`, `prd` or `alpharank`; plain `psro` is
  `nash`) gives it in the meta-game of the past players' returns against each other (the
  league solves it: `selfplay.league.manager.League.meta_strategy`); for an exploiter, the
  meta-strategy of the population as it stood when the exploiter (re)started, which it hunts
  as PSRO's best-response oracle;
- anything else is a fixed opponent: a scripted agent spec such as "random" or "mcts:100".

AlphaStar's main agents mix these (35% self, 50% PFSP over all past players, 15% PFSP with
the variance weighting); its exploiters use `main` or PFSP only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from selfplay.evaluation.meta_solvers import SOLVERS
from selfplay.rollouts import MatchSpec

SELF = "self"
MAIN = "main"
UNIFORM = "uniform"
PFSP = "pfsp"
PSRO = "psro"

PFSP_WEIGHTINGS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "hard": lambda p: (1 - p) ** 2,
    "variance": lambda p: p * (1 - p),
    "linear_capped": lambda p: np.minimum(0.5, 1 - p),
}
UNPLAYED_WIN_RATE = 0.5  # what PFSP assumes of a player the learner has not met yet


def pfsp_probabilities(win_rates: Sequence[float], weighting: str) -> np.ndarray:
    """Each past player's chance of being picked under PFSP with `weighting`, from the learner's
    win rate against each (NaN: never played). If every weight is zero (the learner beats them
    all), the pick is uniform, as in AlphaStar."""
    p = np.asarray(win_rates, dtype=np.float64)
    p = np.where(np.isnan(p), UNPLAYED_WIN_RATE, p)
    weights = PFSP_WEIGHTINGS[weighting](p)
    total = weights.sum()
    return weights / total if total > 0 else np.full(len(p), 1 / len(p))


def is_pfsp(rule: str) -> bool:
    return rule.split(":")[0] == PFSP


def pfsp_weighting(rule: str) -> str:
    """The weighting a `pfsp[:WEIGHTING]` rule names; plain `pfsp` is `hard`."""
    _, _, weighting = rule.partition(":")
    return weighting or "hard"


def is_psro(rule: str) -> bool:
    return rule.split(":")[0] == PSRO


def psro_solver(rule: str) -> str:
    """The meta-solver a `psro[:SOLVER]` rule names; plain `psro` is `nash`."""
    _, _, solver = rule.partition(":")
    return solver or "nash"


def rule_error(rule: str) -> str | None:
    """Why `rule` is not a matchmaking rule of this module, or None (fixed opponents are checked
    by the agent registry)."""
    if is_pfsp(rule) and pfsp_weighting(rule) not in PFSP_WEIGHTINGS:
        return f"unknown PFSP weighting in '{rule}'; choose pfsp:{', pfsp:'.join(PFSP_WEIGHTINGS)}"
    if is_psro(rule) and psro_solver(rule) not in SOLVERS:
        return f"unknown meta-solver in '{rule}'; choose psro:{', psro:'.join(SOLVERS)}"
    return None


def is_fixed(rule: str) -> bool:
    return rule not in (SELF, MAIN, UNIFORM) and not is_pfsp(rule) and not is_psro(rule)


def choose_opponent(
    rng: np.random.Generator,
    rule: str,
    learner: str,
    main: str,
    past_players: Sequence[str],
    win_rate: Callable[[str], float],
    meta_strategy: Callable[[str], Mapping[str, float]] = lambda solver: {},
) -> str:
    """The opponent one draw of `rule` gives `learner`. `past_players` are the frozen players
    open to matching; `win_rate(name)` is the learner's win rate against a player (NaN if
    never played); `meta_strategy(solver)` is the mixture over past players that `solver`
    gives. A rule over past players with none yet falls back to self-play."""
    if rule == SELF:
        return learner
    if rule == MAIN:
        return main
    if is_fixed(rule):
        return rule
    if not past_players:
        return learner
    if rule == UNIFORM:
        return past_players[rng.integers(len(past_players))]
    if is_psro(rule):
        names, weights = zip(*meta_strategy(psro_solver(rule)).items())
        return names[rng.choice(len(names), p=np.asarray(weights) / sum(weights))]
    probabilities = pfsp_probabilities([win_rate(name) for name in past_players], pfsp_weighting(rule))
    return past_players[rng.choice(len(past_players), p=probabilities)]


def draw_rule(rng: np.random.Generator, mix: Mapping[str, float]) -> str:
    rules, weights = zip(*mix.items())
    return rules[rng.choice(len(rules), p=np.asarray(weights) / sum(weights))]


def _in_game(win_rate: Callable[[str, str], float], game: str, name: str) -> float:
    return win_rate(name, game)


def _meta_in_game(
    meta_strategy: Callable[[str, str], Mapping[str, float]], game: str, solver: str
) -> Mapping[str, float]:
    return meta_strategy(solver, game)


def schedule_matches(
    rng: np.random.Generator,
    learner: str,
    mix: Mapping[str, float],
    games: Mapping[str, float],
    roles_of: Mapping[str, Sequence[str]],
    starts: int,
    group_size: int,
    *,
    main: str = MAIN,
    past_players: Sequence[str] = (),
    win_rate: Callable[[str, str], float] = lambda name, game: float("nan"),
    meta_strategy: Callable[[str, str], Mapping[str, float]] = lambda solver, game: {},
    role_mixes: Mapping[str, Mapping[str, float]] = {},
) -> list[MatchSpec]:
    """`starts` game starts that `learner` owns, each played `group_size` times: the game drawn by
    weight, the learner's seat alternating, and every other seat filled by a draw of the mix
    for that seat's role (`role_mixes`, else the learner's `mix`). `win_rate(name, game)` feeds
    PFSP, `meta_strategy(solver, game)` (the mixture over past players in that game) PSRO."""
    names, weights = zip(*games.items())
    game_p = np.asarray(weights) / sum(weights)
    matches = []
    for index in range(starts):
        game = names[rng.choice(len(names), p=game_p)]
        roles = roles_of[game]
        game_win_rate = functools.partial(_in_game, win_rate, game)
        game_meta_strategy = functools.partial(_meta_in_game, meta_strategy, game)
        players = []
        for seat, role in enumerate(roles):
            if seat == index % len(roles):
                players.append(learner)
                continue
            rule = draw_rule(rng, role_mixes.get(role, mix))
            players.append(choose_opponent(rng, rule, learner, main, past_players, game_win_rate, game_meta_strategy))
        seed = int(rng.integers(2**31))
        matches += [MatchSpec(game, tuple(players), seed, owner=learner)] * group_size
    return matches
