"""The match runner: plays series of games between agents, alternating seats."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tqdm import tqdm

from selfplay.agents import Agent, make_agent
from selfplay.errors import UserError
from selfplay.games import InvalidMovePolicy, TextGameEnv, make_env
from selfplay.records import MatchResult


def play_episode(env: TextGameEnv, seats: Sequence[Agent], labels: Sequence[str], seed: int) -> MatchResult:
    """Play one game with `seats[i]` in seat i."""
    env.reset(seed=seed)
    agent_of = dict(zip(env.possible_agents, seats))
    for name in env.agent_iter():
        _, _, terminated, truncated, _ = env.last(observe=False)
        env.step(None if terminated or truncated else agent_of[name].act(env))
    return MatchResult(
        game=env.metadata["name"],
        seed=seed,
        players=tuple(labels),
        rewards=tuple(env.episode_returns[a] for a in env.possible_agents),
        invalid_moves=tuple(len(env.invalid_log[a]) for a in env.possible_agents),
        turns=env.turns,
        end_reason=env.end_reason,
    )


def agent_labels(specs: Sequence[str]) -> list[str]:
    """One label per agent spec; repeated specs get '#1', '#2', ... so each agent is named once."""
    labels = []
    for i, spec in enumerate(specs):
        labels.append(f"{spec}#{specs[:i].count(spec) + 1}" if specs.count(spec) > 1 else spec)
    return labels


def play_series(
    game: str,
    agent_specs: Sequence[str],
    episodes: int,
    seed: int,
    *,
    invalid_moves: InvalidMovePolicy = InvalidMovePolicy(),
    max_turns: int = 50,
    progress: bool = True,
) -> list[MatchResult]:
    """Play `episodes` games of `game`, rotating the agents through the seats each game.

    Everything random (deals, dice, the agents' choices) derives from `seed`: the same call
    gives the same results.
    """
    env = make_env(game, invalid_moves=invalid_moves, max_turns=max_turns)
    if len(agent_specs) != len(env.possible_agents):
        raise UserError(f"'{game}' has {len(env.possible_agents)} seats but {len(agent_specs)} agents were given.")
    env_seeds, *agent_seeds = np.random.SeedSequence(seed).spawn(len(agent_specs) + 1)
    agents = [
        make_agent(spec, env.game, int(seeds.generate_state(1)[0])) for spec, seeds in zip(agent_specs, agent_seeds)
    ]
    labels = agent_labels(agent_specs)
    episode_seeds = env_seeds.generate_state(episodes).tolist()
    results = []
    for episode in tqdm(range(episodes), desc=game, unit="game", disable=not progress, leave=False):
        order = [(episode + seat) % len(agents) for seat in range(len(agents))]
        results.append(
            play_episode(env, [agents[i] for i in order], [labels[i] for i in order], episode_seeds[episode])
        )
    return results
