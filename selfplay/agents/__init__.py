"""Agents by spec: `random`, `mcts[:SIMULATIONS]`, `nash[:ITERATIONS]`, `human`."""

from __future__ import annotations

from collections.abc import Callable

from selfplay.agents.base import Agent, IncompatibleAgentError
from selfplay.config import MAX_COUNT
from selfplay.errors import UserError
from selfplay.games import TextGame


class UnknownAgentError(UserError):
    """An agent spec names no agent; the message lists what exists."""


def _random(game: TextGame, seed: int, arg: str | None) -> Agent:
    from selfplay.agents.random_agent import RandomAgent

    _no_argument("random", arg)
    return RandomAgent(game, seed)


def _mcts(game: TextGame, seed: int, arg: str | None) -> Agent:
    from selfplay.agents.mcts import MCTSAgent

    return MCTSAgent(game, seed, simulations=_positive_int("mcts", arg, default=MCTSAgent.DEFAULT_SIMULATIONS))


def _nash(game: TextGame, seed: int, arg: str | None) -> Agent:
    from selfplay.agents.nash import NashAgent

    return NashAgent(game, seed, iterations=_positive_int("nash", arg, default=NashAgent.DEFAULT_ITERATIONS))


def _human(game: TextGame, seed: int, arg: str | None) -> Agent:
    from selfplay.agents.human import HumanAgent

    _no_argument("human", arg)
    return HumanAgent(game, seed)


AGENTS: dict[str, tuple[Callable[[TextGame, int, str | None], Agent], str]] = {
    "random": (_random, "uniform over the legal moves"),
    "mcts": (_mcts, "OpenSpiel MCTS (ISMCTS for imperfect information); mcts:N sets N simulations"),
    "nash": (_nash, "equilibrium policy solved with OpenSpiel's CFR+; nash:N sets N iterations"),
    "human": (_human, "you, in the terminal"),
}
# Agents that play in the terminal, one move at a time: a command that plays unattended seats none.
INTERACTIVE_AGENTS = frozenset({"human"})


def make_agent(spec: str, game: TextGame, seed: int) -> Agent:
    """The agent a spec names, built for `game`. An agent that cannot play the game raises
    IncompatibleAgentError naming the agents that can."""
    name, _, arg = spec.strip().partition(":")
    if name not in AGENTS:
        raise UnknownAgentError(f"Unknown agent '{spec}'. Agents: {agent_help()}")
    try:
        return AGENTS[name][0](game, seed, arg or None)
    except IncompatibleAgentError as err:
        # A human plays every game, and not in the unattended commands (eval, training) that ask.
        others = [other for other in applicable_agents(game) if other != name and other not in INTERACTIVE_AGENTS]
        raise IncompatibleAgentError(f"{err}; agents that play it: {', '.join(others)}.") from None


def applicable_agents(game: TextGame) -> list[str]:
    """The agents (at their default settings) that can play `game`."""
    from selfplay.agents.mcts import MCTSAgent
    from selfplay.agents.nash import NashAgent

    refusals = {"mcts": MCTSAgent.refusal(game), "nash": NashAgent.refusal(game)}
    return [name for name in AGENTS if refusals.get(name) is None]


def agent_help(interactive: bool = True) -> str:
    """Each agent and what it is; the `INTERACTIVE_AGENTS` only if `interactive`."""
    shown = [name for name in AGENTS if interactive or name not in INTERACTIVE_AGENTS]
    return "; ".join(f"{name} ({AGENTS[name][1]})" for name in shown)


def _no_argument(name: str, arg: str | None) -> None:
    if arg is not None:
        raise UnknownAgentError(f"Agent '{name}' takes no argument, got '{name}:{arg}'.")


def _positive_int(name: str, arg: str | None, default: int) -> int:
    if arg is None:
        return default
    if not (arg.isascii() and arg.isdigit() and len(arg) <= len(str(MAX_COUNT)) and 1 <= int(arg) <= MAX_COUNT):
        raise UnknownAgentError(
            f"'{name}:{arg}': the number after '{name}:' must be a whole number from 1 to {MAX_COUNT}."
        )
    return int(arg)


__all__ = [
    "AGENTS",
    "INTERACTIVE_AGENTS",
    "Agent",
    "IncompatibleAgentError",
    "UnknownAgentError",
    "agent_help",
    "applicable_agents",
    "make_agent",
]
