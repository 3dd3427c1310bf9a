"""Exact play figures in perfect-information games: state coverage, the exact non-loss rate
against random, greedy policies and one-move tactics, checked against known values."""

from __future__ import annotations

import math

import numpy as np
import pyspiel
import pytest

from selfplay.errors import UserError
from selfplay.evaluation.exact_play import (
    greedy,
    losses_vs_random,
    non_loss_vs_random,
    one_move_tactics,
    state_probabilities,
    tactical_moves,
)
from selfplay.evaluation.exploitability import decision_states, information_states, scored_states, state_key

TICTACTOE = pyspiel.load_game("tic_tac_toe")
# Uniformly random TicTacToe: the first player wins 737/1260 of games and the second 363/1260
# (the rest are draws), counting each sequence of moves by its probability.
UNIFORM_NON_LOSS = (1 - 363 / 1260, 1 - 737 / 1260)


def uniform(conversations, answers):
    return [[0.0] * len(group) for group in answers]


def uniform_over(choose) -> dict[str, dict[int, float]]:
    """The policy that plays uniformly among `choose(state)`'s moves on every TicTacToe board."""
    policy = {}
    for key, state in decision_states(TICTACTOE, "tictactoe").items():
        chosen = sorted(choose(state))
        policy[key] = {a: 1 / len(chosen) for a in chosen}
    return policy


def uniform_policy() -> dict[str, dict[int, float]]:
    return uniform_over(lambda state: state.legal_actions())


LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


def completing(board: str, mark: str) -> set[int]:
    """The empty cells that would complete a line of `mark` on `board` (OpenSpiel's 9 characters)."""
    return {c for line in LINES for c in line if board[c] == "." and sum(board[i] == mark for i in line) == 2}


def tactical_policy() -> dict[str, dict[int, float]]:
    """Wins at once where it can, else blocks the opponent's win at once, else plays uniformly."""

    def choose(state) -> set[int]:
        board = str(state).replace("\n", "")
        mine, theirs = ("x", "o") if state.current_player() == 0 else ("o", "x")
        return completing(board, mine) or completing(board, theirs) or set(state.legal_actions())

    return uniform_over(choose)


def test_tictactoe_has_4520_decision_states_each_prompt_showing_its_board():
    states = information_states("tictactoe", by_state=True)
    assert len(states) == len({s.key for s in states}) == 4520
    for state in states[:50]:
        player, board = state.key.split(":", 1)
        assert int(player) == state.player
        shown = state.messages[1]["content"].splitlines()[-7:-4]
        marks = "".join(c if c in "XO" else "." for row in shown for c in row.split("|"))
        assert marks == board.replace("\n", "").upper()


def test_uniform_scores_give_the_known_non_loss_rates_of_random_play():
    probabilities = scored_states(information_states("tictactoe", by_state=True), uniform)
    expected = uniform_policy()
    assert probabilities.keys() == expected.keys()
    assert all(probabilities[key] == pytest.approx(expected[key]) for key in expected)
    assert non_loss_vs_random(TICTACTOE, probabilities) == pytest.approx(UNIFORM_NON_LOSS)
    tactics = one_move_tactics(TICTACTOE, probabilities)
    assert 0.3 < tactics["takes_win"] < 0.5 and 0.2 < tactics["stops_loss"] < 0.4


def test_a_policy_that_takes_wins_and_blocks_scores_one_on_both_tactics_and_loses_less():
    policy = tactical_policy()
    tactics = one_move_tactics(TICTACTOE, policy)
    assert tactics["takes_win"] == 1.0
    assert tactics["stops_loss"] == 1.0
    assert tactics["takes_win_states"] > 2000 and tactics["stops_loss_states"] > 500
    better = non_loss_vs_random(TICTACTOE, policy)
    assert all(b > u + 0.1 for b, u in zip(better, UNIFORM_NON_LOSS))


def played(*actions: int) -> pyspiel.State:
    state = TICTACTOE.new_initial_state()
    for action in actions:
        state.apply_action(action)
    return state


def test_tactical_moves_name_the_wins_else_the_moves_that_stop_a_loss():
    assert tactical_moves(played(0, 3, 1, 4)) == ("takes_win", {2})  # X completes the top row
    assert tactical_moves(played(0, 4, 8, 1)) == ("stops_loss", {7})  # O threatens the middle column
    assert tactical_moves(played()) is None  # nothing at stake yet
    assert tactical_moves(played(1, 0, 5, 4, 7, 6)) is None  # O threatens three cells: every move loses


def test_greedy_plays_the_most_probable_move_only():
    probabilities = {"0:...": {4: 0.5, 0: 0.3, 8: 0.2}, "1:x..": {2: 0.1, 5: 0.9}}
    assert greedy(probabilities) == {"0:...": {4: 1.0}, "1:x..": {5: 1.0}}


def test_exact_non_loss_matches_simulated_games_of_a_non_uniform_policy():
    policy = tactical_policy()
    exact = non_loss_vs_random(TICTACTOE, policy)
    rng = np.random.default_rng(0)
    games = 4000
    for seat in (0, 1):
        non_losses = 0
        for _ in range(games):
            state = TICTACTOE.new_initial_state()
            while not state.is_terminal():
                if state.current_player() == seat:
                    actions, probs = zip(*policy[state_key(state)].items())
                    state.apply_action(int(rng.choice(actions, p=probs)))
                else:
                    state.apply_action(int(rng.choice(state.legal_actions())))
            non_losses += state.returns()[seat] >= 0
        standard_error = math.sqrt(exact[seat] * (1 - exact[seat]) / games)
        assert abs(non_losses / games - exact[seat]) < 4 * standard_error


@pytest.mark.parametrize("game", ["kuhn_poker", "negotiation"])
def test_games_with_hidden_information_or_no_twin_are_refused_before_any_model_call(game):
    with pytest.raises(UserError, match=game):
        state_probabilities(None, None, game)


def test_losses_by_cause_add_up_to_the_losses_and_name_the_tactic_missed():
    uniform_losses = losses_vs_random(TICTACTOE, uniform_policy())
    assert [sum(causes.values()) for causes in uniform_losses] == pytest.approx([1 - n for n in UNIFORM_NON_LOSS])
    assert all(causes["missed_win"] > 0.01 and causes["missed_block"] > 0.01 for causes in uniform_losses)
    # Never missing a win or a block leaves only losses that no move could stop: forks.
    policy = tactical_policy()
    for causes, non_loss in zip(losses_vs_random(TICTACTOE, policy), non_loss_vs_random(TICTACTOE, policy)):
        assert causes["missed_win"] == 0.0 and causes["missed_block"] == 0.0
        assert causes["unstoppable"] == pytest.approx(1 - non_loss) and causes["unstoppable"] > 0


def test_a_policy_that_takes_wins_but_never_blocks_loses_only_by_missed_blocks_and_forks():
    def choose(state) -> set[int]:
        tactic = tactical_moves(state)
        legal = set(state.legal_actions())
        if tactic is None:
            return legal
        kind, good = tactic
        return good if kind == "takes_win" else legal - good

    for causes in losses_vs_random(TICTACTOE, uniform_over(choose)):
        assert causes["missed_win"] == 0.0
        assert causes["missed_block"] > causes["unstoppable"] > 0
