"""The search, solver and human agents: strength against random play, the games each accepts,
the solved Kuhn equilibrium, determinism and the terminal interface."""

from __future__ import annotations

import io

import numpy as np
import pytest

from selfplay.agents import IncompatibleAgentError, agent_help, applicable_agents, make_agent
from selfplay.agents.human import HumanAgent, InputClosedError
from selfplay.agents.nash import NashAgent
from selfplay.errors import UserError
from selfplay.evaluation.scoreboard import tally
from selfplay.games import TextGame, TextGameEnv, make_env, make_game
from selfplay.match import agents_help, parse_agent, play_series

_BET = 1


class SplitGame(TextGame):
    """A one-move game with no OpenSpiel twin: player_0 offers a split of 2, player_1 accepts or not."""

    rules = "player_0 offers 0, 1 or 2 of 2 coins to player_1, who accepts or rejects."

    def reset(self, rng: np.random.Generator) -> None:
        self.offer: str | None = None
        self.reply: str | None = None

    def current_player(self) -> int:
        return 0 if self.offer is None else 1

    def legal_moves(self) -> list[str]:
        return ["0", "1", "2"] if self.offer is None else ["accept", "reject"]

    def apply(self, move: str) -> None:
        if self.offer is None:
            self.offer = move
        else:
            self.reply = move

    def is_over(self) -> bool:
        return self.reply is not None

    def returns(self) -> list[float]:
        given = int(self.offer) if self.reply == "accept" else 0
        kept = 2 - given if self.reply == "accept" else 0
        return [float(kept), float(given)]

    def describe(self, player: int) -> str:
        return f"Offer: {self.offer or 'none yet'}."

    def observation_tensor(self, player: int) -> np.ndarray:
        return np.zeros(1, dtype=np.float32)


def _records(results) -> dict:
    return {record.agent: record for record in tally(results)}


# -- MCTS ---------------------------------------------------------------------------------


def test_mcts_never_loses_tictactoe_to_random_in_either_seat():
    results = play_series("tictactoe", ["mcts:1000", "random"], 40, seed=0, progress=False)
    for seat in (0, 1):
        games = [r for r in results if r.players[seat] == "mcts:1000"]
        assert len(games) == 20
        assert all(r.rewards[seat] >= r.rewards[1 - seat] for r in games)
    assert _records(results)["mcts:1000"].wins >= 30


def test_mcts_beats_random_at_connect_four():
    records = _records(play_series("openspiel:connect_four", ["mcts", "random"], 10, seed=0, progress=False))
    assert records["mcts"].wins >= 9
    assert records["mcts"].invalid_moves == 0


@pytest.mark.parametrize("game", ["kuhn_poker", "openspiel:leduc_poker"])
def test_ismcts_plays_legal_moves_under_hidden_information(game):
    records = _records(play_series(game, ["mcts:50", "random"], 30, seed=0, progress=False))
    assert records["mcts:50"].games == 30
    assert records["mcts:50"].invalid_moves == 0


def test_mcts_beats_random_at_kuhn_poker():
    records = _records(play_series("kuhn_poker", ["mcts", "random"], 1000, seed=0, progress=False))
    assert records["mcts"].mean_reward > 0


def test_mcts_refuses_liars_dice_which_cannot_resample_worlds():
    with pytest.raises(IncompatibleAgentError, match=r"agents that play it: random, nash\.$"):
        make_agent("mcts", make_game("openspiel:liars_dice"), seed=0)


def test_mcts_and_nash_refuse_a_game_without_an_openspiel_twin():
    for spec in ("mcts", "nash"):
        with pytest.raises(IncompatibleAgentError, match=r"agents that play it: random\.$"):
            make_agent(spec, SplitGame(), seed=0)


def test_refusals_name_only_agents_that_play_the_game_and_nash_refuses_games_too_large_to_solve():
    othello, phantom = make_game("openspiel:othello"), make_game("openspiel:phantom_ttt")
    with pytest.raises(IncompatibleAgentError, match=r"has none; agents that play it: random, mcts\.$"):
        make_agent("nash", othello, seed=0)
    make_agent("mcts", othello, seed=0)  # the advice holds
    # Neither search nor solving applies to Phantom Tic-tac-toe: refused at once, not after a long solve.
    with pytest.raises(IncompatibleAgentError, match=r"more than 300000 histories.*agents that play it: random\.$"):
        make_agent("nash", phantom, seed=0)
    with pytest.raises(IncompatibleAgentError, match=r"agents that play it: random\.$"):
        make_agent("mcts", phantom, seed=0)
    assert applicable_agents(make_game("openspiel:kuhn_poker(players=3)")) == ["random", "mcts", "human"]


def test_an_incompatible_agent_is_a_user_error_the_cli_reports():
    with pytest.raises(UserError):
        play_series("openspiel:liars_dice", ["mcts", "random"], 1, seed=0, progress=False)


def test_mcts_is_deterministic_for_a_seed():
    first = play_series("openspiel:connect_four", ["mcts:30", "random"], 4, seed=5, progress=False)
    again = play_series("openspiel:connect_four", ["mcts:30", "random"], 4, seed=5, progress=False)
    assert first == again


# -- Nash (CFR+) --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kuhn_nash() -> NashAgent:
    return NashAgent(make_game("kuhn_poker"), seed=0)


def test_nash_solves_kuhn_poker(kuhn_nash):
    assert kuhn_nash.exploitability < 0.01


def test_nash_solves_leduc_poker():
    assert NashAgent(make_game("openspiel:leduc_poker"), seed=0).exploitability < 0.05


def test_nash_policy_is_in_the_kuhn_equilibrium_family(kuhn_nash):
    # Information states are the card (0=J, 1=Q, 2=K) then the betting (p=pass, b=bet).
    def bet(info_state: str) -> float:
        return kuhn_nash.policy.action_probabilities(info_state)[_BET]

    for facing_bet in ("0b", "0pb"):
        assert bet(facing_bet) < 0.02  # fold J
    for facing_bet in ("2b", "2pb"):
        assert bet(facing_bet) > 0.98  # call with K
    assert bet("1") < 0.02  # player_0 checks Q
    assert bet("1p") < 0.02  # player_1 checks Q behind
    assert bet("2p") > 0.98  # player_1 bets K after a check
    assert bet("0p") == pytest.approx(1 / 3, abs=0.05)  # player_1 bluffs J a third of the time
    assert bet("1b") == pytest.approx(1 / 3, abs=0.05)  # player_1 calls with Q a third of the time
    # player_0's family: bluff J with alpha <= 1/3, bet K with 3 alpha, call with Q with alpha + 1/3.
    alpha = bet("0")
    assert alpha <= 1 / 3 + 0.02
    assert bet("2") == pytest.approx(3 * alpha, abs=0.05)
    assert bet("1pb") == pytest.approx(alpha + 1 / 3, abs=0.05)


@pytest.mark.slow
def test_nash_beats_random_at_kuhn_poker_and_is_deterministic():
    results = play_series("kuhn_poker", ["nash", "random"], 2000, seed=0, progress=False)
    records = _records(results)
    assert records["nash"].mean_reward > 0
    assert records["nash"].invalid_moves == 0
    assert play_series("kuhn_poker", ["nash", "random"], 2000, seed=0, progress=False) == results
    assert play_series("kuhn_poker", ["nash", "random"], 2000, seed=1, progress=False) != results


def test_nash_agents_share_one_solve(kuhn_nash):
    other = NashAgent(make_game("kuhn_poker"), seed=1)
    assert other.policy is kuhn_nash.policy
    assert NashAgent(make_game("kuhn_poker"), seed=0, iterations=7).policy is not kuhn_nash.policy


def test_nash_samples_its_policy():
    env = make_env("kuhn_poker")
    agent = NashAgent(env.game, seed=3)
    bets = []
    for seed in range(1200):
        env.reset(seed=seed)
        if env.game.state.history()[0] == 0:  # player_0 holds the J
            bets.append(env.parse(agent.act(env)) == "bet")
    assert np.mean(bets) == pytest.approx(agent.policy.action_probabilities("0")[_BET], abs=0.06)


def test_nash_refuses_perfect_information_games():
    with pytest.raises(IncompatibleAgentError, match=r"hidden information.*agents that play it: random, mcts\.$"):
        make_agent("nash", make_game("tictactoe"), seed=0)


# -- human ---------------------------------------------------------------------------------------


def _tictactoe_env() -> TextGameEnv:
    env = make_env("tictactoe")
    env.reset(seed=0)
    return env


def test_human_reasks_until_a_legal_move_and_lists_the_legal_moves():
    env = _tictactoe_env()
    out = io.StringIO()
    human = HumanAgent(env.game, seed=0, stdin=io.StringIO("e5\n4\n"), stdout=out)
    answer = human.act(env)
    assert env.parse(answer) == "4"
    text = out.getvalue()
    assert env.game.rules in text
    assert "'e5' is not a legal move. Legal moves: 0, 1, 2, 3, 4, 5, 6, 7, 8" in text


def test_human_accepts_the_boxed_form_and_shows_rules_once():
    env = _tictactoe_env()
    out = io.StringIO()
    human = HumanAgent(env.game, seed=0, stdin=io.StringIO("\\boxed{0}\n 8 \n2\n"), stdout=out)
    env.step(human.act(env))
    env.step(env.answer("4"))
    assert env.parse(human.act(env)) == "8"
    assert out.getvalue().count(env.game.rules) == 1
    env.reset(seed=1)
    assert env.parse(human.act(env)) == "2"
    assert out.getvalue().count(env.game.rules) == 1


def test_human_stops_cleanly_at_end_of_input():
    env = _tictactoe_env()
    human = HumanAgent(env.game, seed=0, stdin=io.StringIO("nine\n"), stdout=io.StringIO())
    with pytest.raises(InputClosedError):
        human.act(env)
    assert issubclass(InputClosedError, UserError)


def test_human_plays_in_the_terminal_only_and_no_unattended_command_seats_it():
    assert "human (you, in the terminal)" in agent_help() and "human" not in agent_help(interactive=False)
    assert "human" in agents_help() and "human" not in agents_help(unattended=True)
    assert "model:SPEC" in agents_help(unattended=True)
    assert parse_agent("human") == "human" and parse_agent("mcts:5", unattended=True) == "mcts:5"
    with pytest.raises(
        UserError, match="plays in the terminal, one move at a time, but eval plays its games unattended"
    ):
        parse_agent("human", unattended=True)
    with pytest.raises(UserError, match="Unknown agent 'alphago'. Agents: random .*model:SPEC") as unknown:
        parse_agent("alphago", unattended=True)
    assert "human" not in str(unknown.value)
    with pytest.raises(UserError, match="'model:' needs a model spec"):
        parse_agent("model:")
