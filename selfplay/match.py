"""The match runner: plays series of games between agents, alternating seats.

Agents are scripted specs ("random", "mcts:200", ...) or language models ("model:SPEC", any
model spec of `selfplay.model_specs`: "model:default", "model:runs/quickstart", ...). Games run
through the rollout engine, so model turns of concurrent games are generated in batches.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace

import numpy as np
from tqdm import tqdm

from selfplay.agents import AGENTS, INTERACTIVE_AGENTS, UnknownAgentError, agent_help, make_agent
from selfplay.backends import PolicyBackend
from selfplay.default_model import MODEL_SPECS_HELP
from selfplay.errors import UserError
from selfplay.games import make_game
from selfplay.model_specs import STYLE_SETTINGS, ModelSpec, model_spec
from selfplay.records import MatchResult
from selfplay.rollouts import MatchSpec, Player, RolloutEngine, RolloutSettings

MODEL_PREFIX = "model:"


def agents_help(unattended: bool = False) -> str:
    """The agents a command seats, for its help: the scripted ones (without those that play in
    the terminal, for a command that plays `unattended`) and language models."""
    return f"{agent_help(interactive=not unattended)}; model:SPEC (a language model, SPEC being {MODEL_SPECS_HELP})"


def parse_agent(spec: str, *, unattended: bool = False) -> ModelSpec | str:
    """What an agent spec names: a language model (`model:SPEC`, resolved by `model_spec`), or a
    scripted agent, given back as its spec for `make_agent`, which checks it against a game. A
    command that plays `unattended` (eval) refuses the agents that play in the terminal."""
    if spec.startswith(MODEL_PREFIX):
        name = spec.removeprefix(MODEL_PREFIX)
        if not name:
            raise UserError("'model:' needs a model spec, e.g. model:default or model:runs/quickstart.")
        return model_spec(name)
    name = spec.strip().partition(":")[0]
    if name not in AGENTS:
        raise UnknownAgentError(f"Unknown agent '{spec}'. Agents: {agents_help(unattended)}")
    if unattended and name in INTERACTIVE_AGENTS:
        seated = [agent for agent in AGENTS if agent not in INTERACTIVE_AGENTS]
        raise UserError(
            f"'{spec}' plays in the terminal, one move at a time, but eval plays its games unattended: give "
            f"opponents from {', '.join(seated)} and model:SPEC. To play a model yourself: selfplay play GAME "
            "--agents human,model:SPEC."
        )
    return spec


def agent_labels(specs: Sequence[str]) -> list[str]:
    """One label per agent spec; repeated specs get '#1', '#2', ... so each agent is named once."""
    labels = []
    for i, spec in enumerate(specs):
        labels.append(f"{spec}#{specs[:i].count(spec) + 1}" if specs.count(spec) > 1 else spec)
    return labels


def build_players(
    game: str,
    specs: Sequence[str],
    backend: str = "hf",
    rollout: RolloutSettings = RolloutSettings(),
    fixed_style: Collection[str] = STYLE_SETTINGS,
) -> tuple[dict[str, Player], dict[str, RolloutSettings]]:
    """Players by label, and how each model among them is asked and sampled
    (`ModelSpec.played_with`); scripted specs are checked against the game up front, and each
    distinct model is loaded once however many seats it takes."""
    twin = make_game(game)
    models: dict[str, PolicyBackend] = {}
    players: dict[str, Player] = {}
    styles: dict[str, RolloutSettings] = {}
    for label, spec in zip(agent_labels(specs), specs):
        agent = parse_agent(spec)
        if isinstance(agent, str):
            make_agent(spec, twin, seed=0)
            players[label] = spec
            continue
        if spec not in models:
            models[spec] = agent.policy(backend)
        players[label] = models[spec]
        styles[label] = agent.played_with(rollout, fixed_style)
    return players, styles


def play_series(
    game: str,
    agent_specs: Sequence[str],
    episodes: int,
    seed: int,
    *,
    rollout: RolloutSettings = RolloutSettings(),
    fixed_style: Collection[str] = STYLE_SETTINGS,
    backend: str = "hf",
    progress: bool = True,
) -> list[MatchResult]:
    """Play `episodes` games of `game`, rotating the agents through the seats each game, as
    `rollout` says (sampling, prompts, invalid moves, turn cap); a model from a run is asked and
    sampled as its run was, but for the settings in `fixed_style` (by default all of them).

    Everything random (deals, dice, the agents' choices, model sampling) derives from `seed`:
    the same call gives the same results.
    """
    seats = make_game(game).num_players
    if len(agent_specs) != seats:
        raise UserError(f"'{game}' has {seats} seats but {len(agent_specs)} agents were given.")
    players, styles = build_players(game, agent_specs, backend, rollout, fixed_style)
    labels = list(players)
    episode_seeds = np.random.SeedSequence(seed).generate_state(episodes).tolist()
    matches = [
        MatchSpec(game, tuple(labels[(episode + seat) % seats] for seat in range(seats)), episode_seeds[episode])
        for episode in range(episodes)
    ]
    settings = replace(rollout, sampling=replace(rollout.sampling, seed=seed))
    trajectories = RolloutEngine(players, settings, styles).run(matches)
    bar = tqdm(trajectories, total=episodes, desc=game, unit="game", disable=not progress, leave=False)
    try:
        return [trajectory.result for trajectory in bar]
    finally:
        for policy in {id(p): p for p in players.values() if not isinstance(p, str)}.values():
            policy.close()
