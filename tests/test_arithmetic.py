"""The one-seat arithmetic game: one expression, scored exactly."""

from __future__ import annotations

import pytest

from selfplay.games import make_env


def answered(spec: str, seed: int, output: str) -> tuple[str, float]:
    env = make_env(spec)
    env.reset(seed=seed)
    task = env.game.task
    env.step(output(task.answer) if callable(output) else output)
    assert env.terminations["solver"]
    return task.statement, env.rewards["solver"]


def test_the_value_scores_1_a_wrong_number_0_and_no_number_the_format_penalty():
    statement, reward = answered("arithmetic", 3, lambda answer: f"\\boxed{{{answer}}}")
    assert statement.startswith("What is ") and reward == 1.0
    assert answered("arithmetic", 3, lambda answer: f"\\boxed{{{int(answer) + 1}}}")[1] == 0.0
    assert answered("arithmetic", 3, "\\boxed{seven}")[1] == 0.0
    assert answered("arithmetic(format_penalty=-1)", 3, "no answer")[1] == -1.0


def test_the_expression_and_its_example_answers_follow_the_seed():
    first, second = make_env("arithmetic"), make_env("arithmetic")
    first.reset(seed=5)
    second.reset(seed=5)
    assert first.game.task == second.game.task
    assert first.legal_moves() == second.legal_moves()
    assert first.game.task.answer in first.legal_moves()
    second.reset(seed=6)
    assert second.game.task != first.game.task


@pytest.mark.parametrize("seed", range(20))
def test_every_drawn_expression_has_2_to_4_numbers_up_to_20(seed):
    env = make_env("arithmetic")
    env.reset(seed=seed)
    numbers = [int(token) for token in env.game.task.key.replace("(", " ").replace(")", " ").split() if token.isdigit()]
    assert 2 <= len(numbers) <= 4 and all(0 <= n <= 20 for n in numbers)
