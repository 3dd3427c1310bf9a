"""The `pettingzoo:MODULE` adapter on PettingZoo's classic games."""

from __future__ import annotations

import sys
import types

import gymnasium
import numpy as np
import pytest

from selfplay.errors import UserError
from selfplay.games import make_env, make_game

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
    assert "agent 'player_1'" in theirs
    tensor = game.observation_tensor(0)
    assert tensor.dtype == np.float32 and tensor.shape == (6, 7, 2) and tensor.sum() == 3
    assert "Moves: Your move is a column number, 0 (left) to 6 (right)" in game.rules
    assert "line up four" in game.rules and "$" not in game.rules  # no LaTeX pasted from the docs


def test_go_board_shows_the_player_to_move_and_the_waiting_one_their_own_stones_as_x():
    env = make_env("pettingzoo:pettingzoo.classic.go_v5(board_size=5)")
    env.reset(seed=0)
    env.step(env.answer("1"))  # black at row 0, column 1
    env.step(env.answer("7"))  # white at row 1, column 2
    black, white = env.observe("player_0")["view"].splitlines(), env.observe("player_1")["view"].splitlines()
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


class _FakeEnv:
    possible_agents = ["a", "b"]
    agent_selection = "a"
    metadata = {"name": "fake_v0"}

    def __init__(self, space: gymnasium.Space, obs: object):
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
    discrete = gymnasium.spaces.Discrete(3)
    with pytest.raises(UserError, match="action mask"):
        make_game(_fake_module(monkeypatch, "fake_unmasked", env=lambda: _FakeEnv(discrete, np.zeros(2))))
    with pytest.raises(UserError, match="parameters"):
        make_game(f"{CONNECT_FOUR}(board_size=9)")
