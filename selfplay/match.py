"""The match runner: plays series of games between agents, alternating seats.

Agents are scripted specs ("random", "mcts:200", ...) or language models
("model:PATH_OR_NAME", "model:default"). Games run through the rollout engine, so model
turns of concurrent games are generated in batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from tqdm import tqdm

from selfplay.agents import make_agent
from selfplay.backends import PolicyBackend, make_backend
from selfplay.default_model import resolve_model
from selfplay.errors import UserError
from selfplay.games import make_game
from selfplay.records import MatchResult
from selfplay.rollouts import MatchSpec, Player, RolloutEngine, RolloutSettings

MODEL_PREFIX = "model:"


def agent_labels(specs: Sequence[str]) -> list[str]:
    """One label per agent spec; repeated specs get '#1', '#2', ... so each agent is named once."""
    labels = []
    for i, spec in enumerate(specs):
        labels.append(f"{spec}#{specs[:i].count(spec) + 1}" if specs.count(spec) > 1 else spec)
    return labels


def build_players(game: str, specs: Sequence[str], backend: str = "hf") -> dict[str, Player]:
    """Players by label; scripted specs are checked against the game up front, and each
    distinct model is loaded once however many seats it takes."""
    twin = make_game(game)
    models: dict[str, PolicyBackend] = {}
    players: dict[str, Player] = {}
    for label, spec in zip(agent_labels(specs), specs):
        if spec.startswith(MODEL_PREFIX):
            name = spec.removeprefix(MODEL_PREFIX)
            if not name:
                raise UserError(
                    "'model:' needs a model name or path, e.g. model:default or model:runs/x/checkpoint-100."
                )
            if name not in models:
                models[name] = load_policy(name, backend)
            players[label] = models[name]
        else:
            make_agent(spec, twin, seed=0)
            players[label] = spec
    return players


def load_policy(model: str, backend: str = "hf") -> PolicyBackend:
    """A backend serving `model` (a model directory, a hub name, or "default")."""
    try:
        return make_backend(backend, resolve_model(model))
    except OSError as err:
        reason = " ".join(str(err).split())
        raise UserError(
            f"Cannot load model '{model}': {reason}. Give a Hugging Face model directory, a model name "
            f"the hub can serve, or 'default' for the built-in model."
        ) from None


def play_series(
    game: str,
    agent_specs: Sequence[str],
    episodes: int,
    seed: int,
    *,
    rollout: RolloutSettings = RolloutSettings(),
    backend: str = "hf",
    progress: bool = True,
) -> list[MatchResult]:
    """Play `episodes` games of `game`, rotating the agents through the seats each game, as
    `rollout` says (sampling, prompts, invalid moves, turn cap).

    Everything random (deals, dice, the agents' choices, model sampling) derives from `seed`:
    the same call gives the same results.
    """
    seats = make_game(game).num_players
    if len(agent_specs) != seats:
        raise UserError(f"'{game}' has {seats} seats but {len(agent_specs)} agents were given.")
    players = build_players(game, agent_specs, backend)
    labels = list(players)
    episode_seeds = np.random.SeedSequence(seed).generate_state(episodes).tolist()
    matches = [
        MatchSpec(game, tuple(labels[(episode + seat) % seats] for seat in range(seats)), episode_seeds[episode])
        for episode in range(episodes)
    ]
    settings = replace(rollout, sampling=replace(rollout.sampling, seed=seed))
    trajectories = RolloutEngine(players, settings).run(matches)
    bar = tqdm(trajectories, total=episodes, desc=game, unit="game", disable=not progress, leave=False)
    try:
        return [trajectory.result for trajectory in bar]
    finally:
        for policy in {id(p): p for p in players.values() if not isinstance(p, str)}.values():
            policy.close()
