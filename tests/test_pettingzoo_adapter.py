"""The `pettingzoo:MODULE` adapter on PettingZoo's classic games."""

from __future__ import annotations

import sys
import types

import gymnasium
import numpy as np
import pytest
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.test import api_test

from selfplay.errors import UserError
from selfplay.games import make_env, make_game
from selfplay.games.pettingzoo_game import PettingZooGame
from selfplay.games.registry import describe_games
from tests.test_registry import readme_example

CONNECT_FOUR = "pettingzoo:pettingzoo.classic.connect_four_v3"
TICTACTOE = "pettingzoo:pettingzoo.classic.tictactoe_v3"


def test_hand_played_connect_four():
    env = make_env(CONNECT_FOUR)
    env.reset(seed=0)
    # player_0 fills column 0, player_1 column 1: player_0 connects four vertically on move 7.
    for turn in range(7):
        assert env.agent_selection == f"player_{turn % 2}"
        env.step(env.answer(str(turn % 2)))
        assert not env.invalid_log[f"player_{turn % 2}"]
    assert env.game.is_over() and env.end_reason == "game_over" and env.turns == 7
    assert env.game.returns() == [1.0, -1.0]
    assert env.episode_returns == {"player_0": 1.0, "player_1": -1.0}
    assert all(env.terminations.values())


def test_connect_four_state_shows_each_player_its_own_pieces_as_x():
    game = make_game(CONNECT_FOUR)
    game.reset(np.random.default_rng(0))
    for move in ("3", "4", "3"):
        game.apply(move)
    assert game.observation_shape == (6, 7, 2)
    mine, theirs = game.describe(0), game.describe(1)
    assert mine.splitlines()[-2:] == [" 4 . . . X . . .", " 5 . . . X O . ."]
    assert theirs.splitlines()[-2:] == [" 4 . . . O . . .", " 5 . . . O X . ."]
    tensor = game.observation_tensor(0)
    assert tensor.dtype == np.float32 and tensor.shape == (6, 7, 2) and tensor.sum() == 3
    assert "Moves: Your move is a column number, 0 (left) to 6 (right)" in game.rules
    assert "line up four" in game.rules and "$" not in game.rules  # no LaTeX pasted from the docs
    assert "simultaneous" not in game.rules  # Connect Four's moves take effect one by one


def test_go_board_shows_the_player_to_move_and_the_waiting_one_their_own_stones_as_x():
    env = make_env("pettingzoo:pettingzoo.classic.go_v5(board_size=5)")
    env.reset(seed=0)
    env.step(env.answer("1"))  # black at row 0, column 1
    env.step(env.answer("7"))  # white at row 1, column 2
    black, white = env.observe("black_0")["view"].splitlines(), env.observe("white_0")["view"].splitlines()
    assert black[2:4] == [" 0 . X . . .", " 1 . . O . ."] and white[2:4] == [" 0 . O . . .", " 1 . . X . ."]
    assert "row r and column c is 5 * r + c" in env.game.rules and "25 passes" in env.game.rules


def test_a_board_of_unknown_feature_planes_is_refused(monkeypatch):
    class Planes(_FakeEnv):
        def observe(self, agent):
            return {"observation": np.zeros((3, 3, 4), dtype=np.int8)}

    discrete = gymnasium.spaces.Discrete(9)
    obs = {"observation": np.zeros((3, 3, 4)), "action_mask": np.ones(9, dtype=np.int8)}
    with pytest.raises(UserError, match="fake_v0' encodes its board as 4 feature planes.*connect_four, tictactoe, go"):
        make_game(_fake_module(monkeypatch, "fake_planes", env=lambda: Planes(discrete, obs)))


def test_parse_is_lenient_and_rejects_illegal_moves():
    game = make_game(CONNECT_FOUR)
    game.reset(np.random.default_rng(0))
    for answer in ("3", "[3]", " 3 ", "move 3", "column 3.", "03"):
        assert game.parse_move(answer) == "3", answer
    for answer in ("7", "-1", "3 or 4", "three", "", "move"):
        assert game.parse_move(answer) is None, answer
    for _ in range(6):
        game.apply("0")
    assert "0" not in game.legal_moves() and game.parse_move("0") is None
    env = make_env(CONNECT_FOUR)
    env.reset(seed=0)
    env.step("\\boxed{9}")
    assert env.end_reason == "invalid_move" and env.invalid_log["player_0"]


def test_tictactoe_uses_the_environments_agents():
    game = make_game(TICTACTOE)
    game.reset(np.random.default_rng(0))
    assert game.agents == ["player_1", "player_2"] and game.current_player() == 0
    assert game.legal_moves() == [str(i) for i in range(9)]
    game.apply("4")
    assert game.current_player() == 1 and "4" not in game.legal_moves()
    # player_1 takes cells 4, 0, 1, 2 (0, 1, 2 is a line); player_2 takes 3, 5, 8.
    for move in ("3", "0", "5", "1", "8", "2"):
        game.apply(move)
        if game.is_over():
            break
    assert game.is_over() and game.returns() == [1.0, -1.0]


class _FakeEnv(AECEnv):
    possible_agents = ["a", "b"]
    agent_selection = "a"
    metadata = {"name": "fake_v0"}

    def __init__(self, space: gymnasium.Space, obs: object):
        super().__init__()
        self.space, self.obs = space, obs

    def action_space(self, agent):
        return self.space

    def reset(self, seed=None, options=None):
        pass

    def last(self, observe=True):
        return self.obs, 0, False, False, {}


def _fake_module(monkeypatch, name: str, **attributes) -> str:
    module = types.ModuleType(name)
    for key, value in attributes.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    return f"pettingzoo:{name}"


def test_unusable_environments_raise_user_errors(monkeypatch):
    with pytest.raises(UserError, match="pettingzoo.classic.no_such_game_v0.*install"):
        make_game("pettingzoo:pettingzoo.classic.no_such_game_v0")
    with pytest.raises(UserError, match="no env"):
        make_game(_fake_module(monkeypatch, "fake_without_env"))
    box = gymnasium.spaces.Box(-1, 1, shape=(2,))
    with pytest.raises(UserError, match="Box action space"):
        make_game(_fake_module(monkeypatch, "fake_box", env=lambda: _FakeEnv(box, {"observation": np.zeros(2)})))
    with pytest.raises(UserError, match="parameters"):
        make_game(f"{CONNECT_FOUR}(board_size=9)")


RPS = "pettingzoo:pettingzoo.classic.rps_v2"


def _play_rounds(env, rounds: list[tuple[str, str]]) -> None:
    for first, second in rounds:
        env.step(env.answer(first))
        env.step(env.answer(second))


def test_an_environment_without_a_mask_offers_every_action_and_plays_out_its_rounds():
    env = make_env(f"{RPS}(max_cycles=2)")
    env.reset(seed=0)
    assert env.legal_moves() == ["0", "1", "2"] and env.game.max_length == 4
    assert "Moves are simultaneous" in env.game.rules
    _play_rounds(env, [("0", "1"), ("2", "1")])  # rock loses to paper, scissors beat paper
    assert env.end_reason == "game_over" and not env.game.truncated()
    assert env.episode_returns == {"player_0": 0.0, "player_1": 0.0}
    env.reset(seed=0)
    _play_rounds(env, [("0", "2"), ("1", "0")])
    assert env.end_reason == "game_over" and env.episode_returns == {"player_0": 2.0, "player_1": -2.0}


def test_the_prompt_names_each_player_as_the_environment_does():
    env = make_env(TICTACTOE)
    env.reset(seed=0)
    assert env.possible_agents == ["player_1", "player_2"]
    for agent in env.possible_agents:
        state = env.observe(agent)["state"]
        other = next(a for a in env.possible_agents if a != agent)
        assert state.startswith(f"You are {agent}.") and "player_0" not in state
        assert f"You are {other}" not in state


class _SealedBids(ParallelEnv):
    """A one-round simultaneous auction: the higher bid of 0-3 wins 1, a tie scores 0. Its
    drawing lists the finished rounds' bids, as a parallel environment's own render may."""

    metadata = {"name": "sealed_bids_v0", "render_modes": ["ansi"]}
    possible_agents = ["bidder_0", "bidder_1"]

    def __init__(self, render_mode: str | None = None):
        self.render_mode = render_mode

    def action_space(self, agent):
        return gymnasium.spaces.Discrete(4)

    def observation_space(self, agent):
        return gymnasium.spaces.Box(0, 3, shape=(2,), dtype=np.float32)

    def reset(self, seed=None, options=None):
        self.agents = self.possible_agents[:]
        self.bids: dict[str, int] = {}
        return {a: np.zeros(2, dtype=np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.bids = dict(actions)
        high = max(self.bids.values())
        winners = [a for a, bid in self.bids.items() if bid == high]
        rewards = {a: (0.0 if len(winners) > 1 else 1.0 if a in winners else -1.0) for a in self.agents}
        observations = {a: np.array([self.bids["bidder_0"], self.bids["bidder_1"]], np.float32) for a in self.agents}
        done = dict.fromkeys(self.agents, True)
        infos = {a: {} for a in self.agents}
        self.agents = []
        return observations, rewards, done, dict.fromkeys(done, False), infos

    def render(self):
        return "Bids so far: " + (", ".join(f"{a} {bid}" for a, bid in self.bids.items()) or "none")


@pytest.mark.parametrize("factory", ["parallel_env", "make_auction"])
def test_a_parallel_environment_hides_each_round_until_every_player_has_moved(monkeypatch, factory):
    spec = _fake_module(monkeypatch, "fake_auction", **{factory: _SealedBids})
    env = make_env(spec if factory == "parallel_env" else f"{spec}.{factory}")
    seen_by_second = set()
    for first_bid in ("0", "3"):
        env.reset(seed=0)
        env.step(env.answer(first_bid))
        assert env.agent_selection == "bidder_1"
        obs = env.observe("bidder_1")
        assert "Bids so far: none" in obs["state"] and "bidder_0 " not in obs["state"]
        seen_by_second.add((obs["state"], obs["view"], obs["observation"].tobytes()))
    assert len(seen_by_second) == 1  # the second bidder's prompt is the same whatever the first bid
    env.step(env.answer("2"))
    assert env.end_reason == "game_over" and env.episode_returns == {"bidder_0": 1.0, "bidder_1": -1.0}
    assert "Bids so far: bidder_0 3, bidder_1 2" in env.observe("bidder_0")["view"]


def test_the_second_player_of_a_round_sees_nothing_of_the_first_players_move():
    for spec in (RPS, f"{RPS}.parallel_env"):
        prompts = set()
        for first in ("0", "1", "2"):
            env = make_env(spec)
            env.reset(seed=0)
            _play_rounds(env, [("1", "2")])
            env.step(env.answer(first))
            obs = env.observe("player_1")
            prompts.add((obs["state"], obs["view"], obs["observation"].tobytes()))
        assert len(prompts) == 1 and "Your observation: 1" in prompts.pop()[0]  # the last round's paper


@pytest.fixture
def rps_package(install_game_package):
    """The README's rock, paper, scissors, installed as a package registering it by entry point."""
    install_game_package(
        "rps", readme_example("PettingZoo environments"), "rock_paper_scissors = my_games.rps:rock_paper_scissors"
    )


def test_the_readme_text_hook_names_moves_and_shows_state_without_subclassing(rps_package):
    assert ("rock_paper_scissors", "Rock, paper, scissors: PettingZoo's rps_v2 with named moves.") in describe_games()
    env = make_env("rock_paper_scissors(max_cycles=2)")
    api_test(env, num_cycles=50)
    env.reset(seed=0)
    assert env.game.rules.startswith("Rock, paper, scissors, over several rounds.")
    state = env.observe("player_0")["state"]
    assert "0 of 2 rounds played.\n" in state and "Legal moves: rock, paper, scissors" in state
    env.step("\\boxed{Rock}")
    env.step("I pick \\boxed{ paper }")
    assert env.observe("player_0")["view"] == "1 of 2 rounds played. Your opponent last played paper."
    env.step("\\boxed{2}")  # an action number is not a move where moves are named
    assert env.end_reason == "invalid_move" and "'2' is not a legal move" in env.invalid_log["player_0"][0]["reason"]


def test_a_drawing_or_a_state_text_shows_a_board_of_unknown_planes(monkeypatch):
    planes = {"observation": np.zeros((3, 3, 4)), "action_mask": np.ones(9, dtype=np.int8)}

    class Drawn(_FakeEnv):
        metadata = {"name": "fake_v0", "render_modes": ["ansi"]}

        def __init__(self, render_mode=None):
            super().__init__(gymnasium.spaces.Discrete(9), planes)
            self.render_mode = render_mode

        def observe(self, agent):
            return planes

        def render(self):
            return "a drawing"

    spec = _fake_module(monkeypatch, "fake_drawn", env=Drawn)
    drawn = make_game(spec)
    assert drawn.describe(0) == "a drawing" and "as the environment draws it" in drawn.rules
    with pytest.raises(UserError, match="4 feature planes.*give the adapter a state_text function"):
        make_game(f"{spec}(render_mode=None)")
    described = PettingZooGame("fake_drawn", render_mode=None, state_text=lambda env, agent: f"{agent}'s view")
    assert described.describe(1) == "b's view"


def test_text_hooks_that_cannot_work_are_refused_naming_the_fix():
    with pytest.raises(UserError, match="state_text .* is a str; it must be a function"):
        PettingZooGame(RPS[len("pettingzoo:") :], state_text="the board")
    with pytest.raises(UserError, match="move_names .* is a int; give a mapping or a list"):
        PettingZooGame(RPS[len("pettingzoo:") :], move_names=3)
    short = PettingZooGame(RPS[len("pettingzoo:") :], move_names={0: "rock", 1: "paper"})
    short.reset(np.random.default_rng(0))
    with pytest.raises(UserError, match="no name for action 2"):
        short.legal_moves()
    same = PettingZooGame(RPS[len("pettingzoo:") :], move_names=lambda env, action: "rock")
    same.reset(np.random.default_rng(0))
    with pytest.raises(UserError, match="names actions 0 and 1 both 'rock'"):
        same.legal_moves()


def test_a_factory_that_makes_no_environment_is_refused(monkeypatch):
    with pytest.raises(UserError, match="os.getcwd made a str, not a PettingZoo AEC or parallel environment"):
        make_game("pettingzoo:os.getcwd")
    with pytest.raises(UserError, match="no env\\(\\) or parallel_env\\(\\)"):
        make_game("pettingzoo:os")
    with pytest.raises(UserError, match="Cannot import.*os.no_such_function.*MODULE.FACTORY"):
        make_game("pettingzoo:os.no_such_function")
