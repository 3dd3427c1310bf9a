import numpy as np
import pytest
from pettingzoo.test import api_test, seed_test

from selfplay.errors import UserError
from selfplay.games import AnswerFormat, InvalidMovePolicy, TextGameEnv
from selfplay.games.base import MAX_TEXT_LENGTH, UnfinishedOutput


def make(count_to, **kwargs):
    env = TextGameEnv(count_to(kwargs.pop("target", 5)), name="count_to", **kwargs)
    env.reset(seed=0)
    return env


def play_out(env, outputs):
    """Step the given outputs, then step finished agents with None until the episode is over."""
    for output in outputs:
        env.step(output)
    finals = {}
    for agent in env.agent_iter():
        _, reward, terminated, truncated, _ = env.last(observe=False)
        assert terminated or truncated, "the scripted outputs should have finished the game"
        finals[agent] = reward
        env.step(None)
    return finals


def test_protocol_passes_pettingzoo_conformance(count_to):
    api_test(TextGameEnv(count_to(), name="count_to"), num_cycles=50)
    seed_test(lambda: TextGameEnv(count_to(), name="count_to"), num_cycles=50)


def test_valid_game_pays_the_winner(count_to):
    env = make(count_to)
    finals = play_out(env, ["\\boxed{2}", "I add two: \\boxed{ 2 }", "\\boxed{[1]}"])
    assert finals == {"player_0": 1.0, "player_1": -1.0}
    assert env.episode_returns == {"player_0": 1.0, "player_1": -1.0}
    assert env.end_reason == "game_over" and env.turns == 3
    assert env.invalid_log == {"player_0": [], "player_1": []}


def test_unparsable_output_ends_game_with_spiral_penalties(count_to):
    env = make(count_to)
    env.step("\\boxed{1}")
    finals = play_out(env, ["I refuse to answer"])
    assert finals == {"player_0": 0.5, "player_1": -1.5}
    assert env.end_reason == "invalid_move"
    [record] = env.invalid_log["player_1"]
    assert record["turn"] == 1 and "no answer found" in record["reason"]
    assert record["output"] == "I refuse to answer"


def test_illegal_move_and_non_text_actions_are_invalid_not_errors(count_to):
    env = make(count_to)
    env.step("\\boxed{3}")
    assert env.end_reason == "invalid_move"
    assert "'3' is not a legal move" in env.invalid_log["player_0"][0]["reason"]
    env = make(count_to)
    env.step(np.int64(1))
    assert "expected the model's output text" in env.invalid_log["player_0"][0]["reason"]


def test_retries_keep_the_turn_and_explain_the_error(count_to):
    env = make(count_to, invalid_moves=InvalidMovePolicy(retries=2, penalty=-1.0, opponent_reward=1.0))
    env.step("no idea")
    env.step("\\boxed{7}")
    assert env.agent_selection == "player_0" and env.end_reason is None
    assert "Your previous answer was invalid ('7' is not a legal move)" in env.observe("player_0")["state"]
    env.step("\\boxed{1}")
    assert env.agent_selection == "player_1"
    assert "invalid" not in env.observe("player_1")["state"]
    assert len(env.invalid_log["player_0"]) == 2
    # A fresh turn gets fresh retries; the third failure on one turn ends the game.
    finals = play_out(env, ["a", "b", "c"])
    assert finals == {"player_0": 1.0, "player_1": -1.0}
    assert len(env.invalid_log["player_1"]) == 3


def test_format_credit_rewards_a_marked_answer_that_names_no_legal_move(count_to):
    from selfplay.config import RolloutConfig
    from selfplay.rollouts import RolloutSettings

    policy = RolloutSettings.from_config(RolloutConfig(format_credit=0.5)).invalid_moves
    assert policy == InvalidMovePolicy(penalty=-1.5, opponent_reward=0.5, format_credit=0.5)
    finals = {}
    outputs = ("\\boxed{7}", "7, I think", UnfinishedOutput("\\boxed{1} and then"), UnfinishedOutput("\\boxed{1"))
    for output in outputs:
        env = make(count_to, invalid_moves=policy)
        finals[str(output)] = play_out(env, [output])
        assert env.end_reason == "invalid_move" and len(env.invalid_log["player_0"]) == 1
    # A whole answer marker earns the credit, even in a response cut off after it (still an invalid move).
    assert [f["player_0"] for f in finals.values()] == [-1.0, -1.5, -1.0, -1.5]
    assert all(f["player_1"] == 0.5 for f in finals.values())


def test_turn_cap_is_a_truncated_draw(count_to):
    env = make(count_to, target=100, max_turns=4)
    finals = play_out(env, ["\\boxed{1}"] * 4)
    assert finals == {"player_0": 0.0, "player_1": 0.0}
    assert env.end_reason == "turn_cap"


def test_observation_text_for_mover_and_waiting_player(count_to):
    env = make(count_to)
    mover = env.observe("player_0")
    assert mover["rules"].startswith("Add 1 or 2")
    assert "Legal moves: 1, 2" in mover["state"] and "\\boxed{1}" in mover["state"]
    assert mover["observation"].dtype == np.float32
    waiting = env.observe("player_1")["state"]
    assert "Waiting for player_0" in waiting and "Legal moves" not in waiting


def test_moves_with_commas_are_listed_one_per_line():
    from selfplay.games import make_env

    env = make_env("openspiel:nim(pile_sizes=1;2)")
    env.reset(seed=0)
    assert "Legal moves, one per line:\npile:1, take:1;\npile:2, take:1;\n" in env.observe("player_0")["state"]


def test_text_stays_inside_the_observation_space(count_to):
    game = count_to()
    game.rules = "Règles: ajoutez 1 ou 2 ✓"
    env = TextGameEnv(game, name="count_to")
    env.reset(seed=0)
    obs = env.observe("player_0")
    assert obs["rules"] == "Regles: ajoutez 1 ou 2 [check mark]"  # ASCII, nothing lost to "?"
    assert env.observation_space("player_0").contains(obs)


def test_a_state_too_long_to_prompt_is_refused_with_its_size_where_it_arises(count_to):
    class Growing(count_to):
        def describe(self, player):  # the state text outgrows an observation once the total is 2
            return "x" * (self.total * MAX_TEXT_LENGTH // 2)

    env = TextGameEnv(Growing(), name="growing")
    env.reset(seed=0)
    env.observe("player_0")
    env.step("\\boxed{2}")
    with pytest.raises(UserError, match=r"'growing' is too large to prompt: its state text for player_1 at turn 1"):
        env.observe("player_1")


def test_a_game_can_choose_its_answer_format(count_to):
    game = count_to()
    game.answer_format = AnswerFormat("<move>", "</move>")
    env = TextGameEnv(game, name="count_to")
    env.reset(seed=0)
    assert "<move>1</move>" in env.observe("player_0")["state"]
    env.step("\\boxed{1}")
    assert env.end_reason == "invalid_move"
    env.reset(seed=0)
    env.step("<move>2</move>")
    assert env.agent_selection == "player_1"
