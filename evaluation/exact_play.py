"""Exact figures of a language model's policy in a small perfect-information game: its expected
non-loss rate against a uniformly random opponent, and how it plays one-move tactics.

The model is probed once at every distinct decision state of the game's OpenSpiel twin (4,520
in TicTacToe) with the prompt the rollout engine builds there in single-turn play (a
multi-turn prompt depends on the move order, not on the state alone), sampled as the rollouts
sample, as `selfplay.evaluation.exploitability` probes information states. From those probabilities the
game tree is solved exactly, so the figures carry none of the noise of sampled games (400
sampled games measure a non-loss rate near 0.75 only to within about +-0.04).

The tactics read the state directly, which a win rate does not:
- takes_win: the probability of winning at once, averaged over the states where a move does;
- stops_loss: where no move wins at once, some moves leave the opponent a win at once and some
  do not, the probability of a move that does not.
A policy that ignores the board scores on both about what a uniformly random legal move does.
Each seat's losses against random are split by what its last move faced (`losses_vs_random`):
a win it missed, a threat it could have stopped, or neither, which tells a policy that has not
learned to block from one that loses to forks set up earlier.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyspiel

from selfplay.errors import UserError
from selfplay.evaluation.exploitability import (
    decision_states,
    information_states,
    rollout_scorer,
    scored_states,
    state_key,
    twin_env,
)
from selfplay.rollouts import RolloutSettings

Probabilities = dict[str, dict[int, float]]  # state_key -> {OpenSpiel action: probability}


# The games whose every decision state the probe asks in seconds on a CPU.
SUPPORTED_GAMES = ("tictactoe",)


def perfect_information_twin(game: str) -> pyspiel.Game:
    """`game`'s OpenSpiel twin, refused unless it is a zero-sum game of perfect information."""
    spiel_game = twin_env(game).game.spiel_game
    if spiel_game.get_type().information != pyspiel.GameType.Information.PERFECT_INFORMATION:
        raise UserError(f"'{game}' hides information: its exact figure is exploitability (selfplay eval).")
    return spiel_game


def state_probabilities(
    model,
    tokenizer,
    game: str,
    rollout: RolloutSettings = RolloutSettings(),
    on_batch: Callable[[int, int], None] | None = None,
) -> Probabilities:
    """The model's move probabilities at every decision state of `game`, asked and scored as the
    rollouts `rollout` ask it and sample it (as `selfplay.evaluation.exploitability.move_probabilities`
    reads them; `on_batch` as there). Single-turn play only (`information_states`)."""
    perfect_information_twin(game)
    states = information_states(game, by_state=True, prompt=rollout.prompt, observation_mode=rollout.observation_mode)
    return scored_states(states, rollout_scorer(model, tokenizer, rollout, on_batch=on_batch))


def exact_non_loss(
    model,
    tokenizer,
    game: str,
    rollout: RolloutSettings = RolloutSettings(),
    on_batch: Callable[[int, int], None] | None = None,
) -> list[float]:
    """For each seat, the exact probability that the model, asked and sampled as `rollout` says,
    does not lose against a uniformly random opponent."""
    probabilities = state_probabilities(model, tokenizer, game, rollout, on_batch)
    return non_loss_vs_random(perfect_information_twin(game), probabilities)


def greedy(probabilities: Probabilities) -> Probabilities:
    """The policy that plays the most probable move of `probabilities` in every state."""
    return {key: {max(actions, key=actions.get): 1.0} for key, actions in probabilities.items()}


def non_loss_vs_random(spiel_game: pyspiel.Game, probabilities: Probabilities) -> list[float]:
    """For each seat, the exact probability that the policy does not lose against an opponent
    that picks uniformly among its legal moves."""
    return _non_loss(losses_vs_random(spiel_game, probabilities))


def _non_loss(losses: list[dict[str, float]]) -> list[float]:
    return [1.0 - sum(causes.values()) for causes in losses]


LOSS_CAUSES = ("missed_win", "missed_block", "unstoppable")
_CAUSE_OF_TACTIC = {"takes_win": 0, "stops_loss": 1}  # `tactical_moves`' kinds, as LOSS_CAUSES indices
_UNSTOPPABLE = LOSS_CAUSES.index("unstoppable")


def losses_vs_random(spiel_game: pyspiel.Game, probabilities: Probabilities) -> list[dict[str, float]]:
    """For each seat, the exact probability of losing against a uniformly random opponent, split
    by what the seat faced at its last move before the loss (`tactical_moves`): `missed_win`, a
    move won at once; `missed_block`, some moves left the opponent no win at once; `unstoppable`,
    otherwise (no move did, as against a fork, or the loss lay further ahead)."""
    values: dict[tuple[str, int, int | None], np.ndarray] = {}

    def losses(state: pyspiel.State, seat: int, cause: int) -> np.ndarray:
        if state.is_terminal():
            lost = np.zeros(len(LOSS_CAUSES))
            lost[cause] = float(state.returns()[seat] < 0)
            return lost
        # What follows the seat's own move does not depend on its earlier moves' causes.
        to_move = state.current_player() == seat
        known = (state_key(state), seat, None if to_move else cause)
        if known not in values:
            if state.is_chance_node():
                moves = state.chance_outcomes()
            elif to_move:
                moves = probabilities[known[0]].items()
                tactic = tactical_moves(state)
                cause = _CAUSE_OF_TACTIC[tactic[0]] if tactic else _UNSTOPPABLE
            else:
                legal = state.legal_actions()
                moves = [(action, 1.0 / len(legal)) for action in legal]
            values[known] = sum(
                (p * losses(state.child(action), seat, cause) for action, p in moves if p > 0),
                np.zeros(len(LOSS_CAUSES)),
            )
        return values[known]

    # A loss before the seat's first move is one it could not stop.
    return [
        dict(zip(LOSS_CAUSES, losses(spiel_game.new_initial_state(), seat, _UNSTOPPABLE).tolist()))
        for seat in range(spiel_game.num_players())
    ]


def tactical_moves(state: pyspiel.State) -> tuple[str, set[int]] | None:
    """("takes_win", the moves that win at once) where some move does; else ("stops_loss", the
    moves that leave the opponent no win at once) where some do and some do not; else None."""
    winning = _winning_moves(state)
    if winning:
        return "takes_win", winning
    legal = state.legal_actions()
    safe = {a for a in legal if (child := state.child(a)).is_terminal() or not _winning_moves(child)}
    return ("stops_loss", safe) if 0 < len(safe) < len(legal) else None


def one_move_tactics(spiel_game: pyspiel.Game, probabilities: Probabilities) -> dict[str, float]:
    """Mean probability of taking a win at once and of stopping the opponent's win at once (see
    the module's docstring and `tactical_moves`), with the number of states each mean is over."""
    found: dict[str, list[float]] = {"takes_win": [], "stops_loss": []}
    for key, state in decision_states(spiel_game, spiel_game.get_type().short_name).items():
        tactic = tactical_moves(state)
        if tactic is not None:
            kind, good = tactic
            found[kind].append(sum(probabilities[key].get(a, 0.0) for a in good))
    report: dict[str, float] = {}
    for kind, values in found.items():
        report[kind] = float(np.mean(values)) if values else float("nan")
        report[f"{kind}_states"] = len(values)
    return report


def _winning_moves(state: pyspiel.State) -> set[int]:
    """The legal moves that win the game at once for the player to move."""
    mover = state.current_player()
    return {a for a in state.legal_actions() if _ends_in_win(state.child(a), mover)}


def _ends_in_win(state: pyspiel.State, player: int) -> bool:
    return state.is_terminal() and state.returns()[player] > 0


def exact_report(model, tokenizer, game: str, rollout: RolloutSettings = RolloutSettings()) -> dict:
    """Exact non-loss against random per seat, for the policy and for its greedy version, with
    each seat's losses by cause (`losses_vs_random`), and the one-move tactics of the policy
    (read as `state_probabilities` reads it)."""
    spiel_game = perfect_information_twin(game)
    probabilities = state_probabilities(model, tokenizer, game, rollout)
    report = {}
    for name, policy in (("sampled", probabilities), ("greedy", greedy(probabilities))):
        losses = losses_vs_random(spiel_game, policy)
        seats = _non_loss(losses)
        report[name] = {"seat_0": seats[0], "seat_1": seats[1], "non_loss": float(np.mean(seats))}
        report[name].update({f"losses_seat_{seat}": causes for seat, causes in enumerate(losses)})
    report["tactics"] = one_move_tactics(spiel_game, probabilities)
    return report
