"""The match runner: plays series of games between agents, alternating seats.

Agents are scripted specs ("random", "mcts:200", ...) or language models ("model:SPEC", any
model spec of `selfplay.model_specs`: "model:default", "model:runs/quickstart", ...). Games run
through the rollout engine, so model turns of concurrent games are generated in batches.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

import numpy as np
from tqdm import tqdm

from selfplay.agents import AGENTS, INTERACTIVE_AGENTS, UnknownAgentError, agent_help, make_agent
from selfplay.backends import PolicyBackend
from selfplay.default_model import MODEL_SPECS_HELP
from selfplay.errors import UserError
from selfplay.games import make_game
from selfplay.model_specs import STYLE_SETTINGS, ModelSpec, model_spec
from selfplay.records import MatchResult, Trajectory
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


@dataclass(frozen=True)
class Lineup:
    """Who plays a series: the players by label, and how each model among them is asked and sampled."""

    players: dict[str, Player]
    styles: dict[str, RolloutSettings]  # by the label of each model player


def build_players(
    game: str,
    specs: Sequence[str],
    backend: str = "hf",
    rollout: RolloutSettings = RolloutSettings(),
    fixed_style: Collection[str] = STYLE_SETTINGS,
) -> Lineup:
    """Players by label, and how each model among them is asked and sampled
    (`ModelSpec.played_with`); scripted specs are checked against the game up front, and each
    distinct model is loaded once however many seats it takes."""
    twin = make_game(game)
    models: dict[str, PolicyBackend] = {}
    lineup = Lineup({}, {})
    for label, spec in zip(agent_labels(specs), specs):
        agent = parse_agent(spec)
        if isinstance(agent, str):
            make_agent(spec, twin, seed=0)
            lineup.players[label] = spec
            continue
        if spec not in models:
            models[spec] = agent.policy(backend)
        lineup.players[label] = models[spec]
        lineup.styles[label] = agent.played_with(rollout, fixed_style)
    return lineup


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
    on_game: Callable[[Trajectory, Lineup], None] = lambda trajectory, lineup: None,
) -> list[MatchResult]:
    """Play `episodes` games of `game`, rotating the agents through the seats each game, as
    `rollout` says (sampling, prompts, invalid moves, turn cap); a model from a run is asked and
    sampled as its run was, but for the settings in `fixed_style` (by default all of them).
    `on_game` is given each game's trajectory as it ends (its models still loaded), with the lineup.

    Everything random (deals, dice, the agents' choices, model sampling) derives from `seed`:
    the same call gives the same results.
    """
    seats = make_game(game).num_players
    if len(agent_specs) != seats:
        raise UserError(f"'{game}' has {seats} seats but {len(agent_specs)} agents were given.")
    lineup = build_players(game, agent_specs, backend, rollout, fixed_style)
    labels = list(lineup.players)
    episode_seeds = np.random.SeedSequence(seed).generate_state(episodes).tolist()
    matches = [
        MatchSpec(game, tuple(labels[(episode + seat) % seats] for seat in range(seats)), episode_seeds[episode])
        for episode in range(episodes)
    ]
    settings = replace(rollout, sampling=replace(rollout.sampling, seed=seed))
    trajectories = RolloutEngine(lineup.players, settings, lineup.styles).run(matches)
    bar = tqdm(trajectories, total=episodes, desc=game, unit="game", disable=not progress, leave=False)
    results = []
    try:
        for trajectory in bar:
            on_game(trajectory, lineup)
            results.append(trajectory.result)
        return results
    finally:
        for policy in {id(p): p for p in lineup.players.values() if not isinstance(p, str)}.values():
            policy.close()
