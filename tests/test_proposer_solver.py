"""The proposer/solver game: its roles' rewards, the arithmetic domain, the task buffer, and
a game played through the environment."""

from __future__ import annotations

import ast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from selfplay.errors import UserError
from selfplay.games import make_env
from selfplay.roles.base import ROLES, advantage_key
from selfplay.roles.domains import Arithmetic
from selfplay.roles.proposer_solver import learnability, proposer, solver
from selfplay.roles.task_buffer import TaskBuffer


@pytest.mark.parametrize("rate, reward", [(0.0, 0.0), (0.25, 0.75), (0.5, 0.5), (0.75, 0.25), (1.0, 0.0)])
def test_learnability_rewards_tasks_some_but_not_all_solvers_solve(rate, reward):
    assert learnability(rate) == reward


def test_role_rewards_and_format_penalties():
    role = proposer("difficulty", format_penalty=-0.5)
    assert role.reward({"valid": 1.0, "success_rate": 1.0}) == 0.0
    assert role.reward({"valid": 1.0, "success_rate": 0.0}) == 1.0
    assert role.reward({"valid": 0.0, "success_rate": 0.0}) == -0.5
    answerer = solver(format_penalty=-2.0)
    assert answerer.reward({"readable": True, "correct": True}) == 1.0
    assert answerer.reward({"readable": True, "correct": False}) == 0.0
    assert answerer.reward({"readable": False, "correct": False}) == -2.0
    assert ROLES["solver"] is answerer


@pytest.mark.parametrize(
    "text, answer",
    [("3 + 4 * 2", "11"), ("(20 - 5) * 2", "30"), ("0 - 7", "-7"), ("2*3*4*5", "120")],
)
def test_arithmetic_reads_and_evaluates_proposals(text, answer):
    task = Arithmetic().read_proposal(text, "evaluate")
    assert task is not None and task.answer == answer


@pytest.mark.parametrize(
    "text",
    ["7", "1 + 2 + 3 + 4 + 5", "21 + 1", "2 ** 8", "3 / 2", "x + 1", "__import__('os')", "1 +", "-3 + 4", "True + 1"],
)
def test_arithmetic_refuses_what_is_not_a_task(text):
    assert Arithmetic().read_proposal(text, "evaluate") is None


def test_arithmetic_checks_answers():
    domain = Arithmetic()
    task = domain.read_proposal("12 * 3 - 6", "evaluate")
    assert domain.readable(task, " 30 ") and domain.check(task, "30")
    assert domain.readable(task, "31") and not domain.check(task, "31")
    assert not domain.readable(task, "thirty") and not domain.readable(task, "30.0")
    rng = np.random.default_rng(0)
    assert all(domain.read_proposal(p, "evaluate") for p in domain.example_proposals(rng, "evaluate", 50))


def test_task_buffer_grows_with_new_valid_tasks_and_measures_diversity():
    domain = Arithmetic()
    buffer = TaskBuffer(domain.seed_tasks())
    assert buffer.metrics() == {"buffer_size": 4.0}
    a, b = domain.read_proposal("1 + 2", "evaluate"), domain.read_proposal("2 + 1", "evaluate")
    for task in (a, a, None, b):
        buffer.record(task)
    assert buffer.metrics() == {
        "buffer_size": 6.0,
        "proposals": 4.0,
        "valid_rate": 0.75,
        "distinct_proposals": 2 / 3,
        "distinct_answers": 1 / 3,  # all three say 3
        "new_to_buffer": 2 / 3,
    }
    assert buffer.metrics() == {"buffer_size": 6.0}  # figures are per reading
    shown = buffer.sample(np.random.default_rng(0), 3)
    assert len({t.key for t in shown}) == 3


def play(env, outputs):
    for output in outputs:
        env.step(output)
    return env.episode_returns


def test_a_game_scores_each_role_and_unreadable_answers_do_not_stop_it():
    env = make_env("proposer_solver(attempts=4)")
    env.reset(seed=0)
    env.game.training_metrics()  # the buffer is shared in the process: start its figures afresh
    assert env.possible_agents == ["proposer", "solver_0", "solver_1", "solver_2", "solver_3"]
    assert [env.role(a) for a in env.possible_agents] == ["proposer"] + ["solver"] * 4
    assert "Tasks proposed before" in env.observe("proposer")["state"]
    assert "Waiting for the proposer" in env.observe("solver_0")["state"]
    env.step("Let me think: 3 + 4 * 2 is a good one. \\boxed{3 + 4 * 2}")
    state = env.observe("solver_2")["state"]
    assert "What is 3 + 4 * 2?" in state and "good one" not in state  # only the answer reaches solvers
    returns = play(env, ["\\boxed{11}", "no box at all", "\\boxed{eleven}", "\\boxed{14}"])
    # One of four right: the proposer's learnability is 0.75; unreadable answers cost the penalty.
    assert returns == {"proposer": 0.75, "solver_0": 1.0, "solver_1": -1.0, "solver_2": -1.0, "solver_3": 0.0}
    assert env.end_reason == "game_over"
    assert [len(env.invalid_log[a]) for a in env.possible_agents] == [0, 0, 1, 1, 0]
    figures = env.game.training_metrics()
    assert figures["solver_accuracy"] == 0.25 and figures["solver_unreadable"] == 0.5


def test_an_invalid_task_ends_the_game_with_the_format_penalty():
    env = make_env("proposer_solver(attempts=2, format_penalty=-0.5)")
    env.reset(seed=1)
    assert play(env, ["\\boxed{2 ** 100}"]) == {"proposer": -0.5, "solver_0": 0.0, "solver_1": 0.0}


def test_tasks_every_solver_solves_teach_nothing():
    env = make_env("proposer_solver(attempts=2)")
    env.reset(seed=2)
    assert play(env, ["\\boxed{2 + 2}", "\\boxed{4}", "\\boxed{4}"]) == {
        "proposer": 0.0,
        "solver_0": 1.0,
        "solver_1": 1.0,
    }


@pytest.mark.parametrize("novel_only, task, again", [(False, "17 * 3 - 19 + 8", 0.5), (True, "17 * 3 - 18 + 7", 0.0)])
def test_novel_only_pays_nothing_for_a_task_the_buffer_holds(novel_only, task, again):
    env = make_env(f"proposer_solver(attempts=2, novel_only={str(novel_only).lower()})")
    returns = []
    for seed in (3, 4):  # the same task twice: new to the buffer, then held by it; one solver right
        env.reset(seed=seed)
        returns.append(play(env, [f"\\boxed{{{task}}}", "\\boxed{40}", "\\boxed{41}"])["proposer"])
    assert returns == [0.5, again]


def test_solver_turns_share_one_advantage_key():
    from selfplay.records import Turn

    turns = [
        Turn("proposer_solver", 0, seat, "solver", "main", 0, (), (), (), "", "stop", False, 0.0) for seat in (1, 3)
    ]
    assert advantage_key(turns[0]) == advantage_key(turns[1]) == ("proposer_solver", "solver")


@pytest.mark.parametrize(
    "spec, message",
    [
        ("proposer_solver(domain=chess)", "unknown domain"),
        ("proposer_solver(attempts=1)", "at least 2"),
        ("proposer_solver(task_type=induction)", "task types"),
        ("proposer_solver(proposer_reward=fun)", "proposer_reward"),
    ],
)
def test_bad_parameters_are_named(spec, message):
    with pytest.raises(UserError, match=message):
        make_env(spec)


@pytest.fixture(scope="module")
def python_domain(bubblewrap):
    from selfplay.roles.domains import Python
    from selfplay.roles.sandbox import Sandbox, SandboxLimits

    return Python(Sandbox(SandboxLimits(cpu_seconds=1, wall_seconds=3)))


DOUBLE = "def f(x):\n    return x * 2"


def test_python_deduction_and_abduction_are_checked_by_running_the_code(python_domain):
    task = python_domain.read_proposal(f"```python\n{DOUBLE}\n```\ninput: 3", "deduction")
    assert task.answer == "6" and "f(3)" in task.statement
    assert python_domain.check(task, "6") and not python_domain.check(task, "7")
    assert not python_domain.readable(task, "six")
    task = python_domain.read_proposal(f"{DOUBLE}\ninput: 'ab'", "abduction")
    assert task.answer == "'abab'" and "'abab'" in task.statement and "'ab'" not in task.statement
    assert python_domain.check(task, "'ab'") and not python_domain.check(task, "'a'")


def test_python_induction_accepts_any_function_that_fits_every_pair(python_domain):
    task = python_domain.read_proposal(f"{DOUBLE}\ninput: 1\ninput: 2\ninput: 5", "induction")
    assert "f(5) = 10" in task.statement and "return" not in task.statement
    assert python_domain.check(task, "def f(x):\n    return x + x")
    assert not python_domain.check(task, "def f(x):\n    return x + 2")
    assert not python_domain.readable(task, "x + x")


@pytest.mark.parametrize(
    "text",
    [
        "def f(x):\n    while True:\n        pass\ninput: 1",  # runs out of time
        "import os\ndef f(x):\n    return os.getcwd()\ninput: 1",  # a banned module
        "def f(x):\n    return id(object())\ninput: 1",  # not deterministic
        "def f(x):\n    return object\ninput: 1",  # an output that is not a literal
        "def f(x):\n    return x",  # no input
        "def f(x) return x\ninput: 1",  # does not parse
        "def g(x):\n    return x\ninput: 1",  # no f
    ],
)
def test_python_proposals_that_fail_to_parse_run_or_repeat_are_not_tasks(python_domain, text):
    assert python_domain.read_proposal(text, "deduction") is None


def test_python_seed_tasks_cover_every_task_type(python_domain):
    tasks = python_domain.seed_tasks()
    assert {t.task_type for t in tasks} == {"deduction", "abduction", "induction"} and len(tasks) == 12


@pytest.mark.usefixtures("bubblewrap")
def test_a_python_game_through_the_environment_reports_its_sandbox_runs():
    env = make_env("proposer_solver(domain=python, task_type=deduction, attempts=2)")
    env.reset(seed=0)
    env.game.training_metrics()  # the sandbox is shared in the process: start its figures afresh
    env.step(f"I will double it. <answer>\n{DOUBLE}\ninput: 21\n</answer>")
    assert "f(21)" in env.observe("solver_0")["state"]
    returns = play(env, ["<answer>42</answer>", "<answer>41</answer>"])
    assert returns == {"proposer": 0.5, "solver_0": 1.0, "solver_1": 0.0}
    figures = env.game.training_metrics()
    assert figures["sandbox/runs"] == 2.0  # the proposal, run twice to check that it is deterministic
    assert 0 < figures["sandbox/start_ms"] < figures["sandbox/run_ms"]


def test_the_sandbox_is_chosen_by_name_and_unsafe_says_so():
    with pytest.raises(UserError, match="sandbox must be one of bubblewrap, unsafe"):
        make_env("proposer_solver(domain=python, sandbox=docker)")
    env = make_env("proposer_solver(domain=python, task_type=deduction, attempts=2, sandbox=unsafe)")
    assert env.game.domain.sandbox.isolation == "unsafe"


def test_without_bubblewrap_code_execution_refuses_to_start(monkeypatch):
    from selfplay.roles import bubblewrap, sandbox

    monkeypatch.setattr(bubblewrap.shutil, "which", lambda name: None)
    bubblewrap.jail.cache_clear()
    sandbox.shared_sandbox.cache_clear()
    try:
        with pytest.raises(UserError, match="apt-get install bubblewrap.*sandbox=unsafe"):
            make_env("proposer_solver(domain=python)")
    finally:
        bubblewrap.jail.cache_clear()
        sandbox.shared_sandbox.cache_clear()


# Python values whose repr is a literal the answer grammar describes: bounded numbers, printable
# strings without quotes, backslashes or tags (repr writes them as they are), and containers of
# them (hashable set members and dict keys).
_KEYS = st.one_of(
    st.integers(-(10**9) + 1, 10**9 - 1),
    st.text(st.characters(blacklist_characters="'\"\\<>"), max_size=24).filter(str.isprintable),
)
_VALUES = st.recursive(
    st.one_of(_KEYS, st.booleans(), st.none()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=8),
        st.lists(inner, max_size=8).map(tuple),
        st.frozensets(_KEYS, min_size=1, max_size=8).map(set),
        st.dictionaries(_KEYS, inner, max_size=8),
    ),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def literal_matcher(python_domain, grammars):
    """A matcher of the python domain's literal answers, and a function: does it take `text` whole?"""
    from selfplay.structured_decoding import grammar_text

    deduction = python_domain.read_proposal(f"{DOUBLE}\ninput: 3", "deduction")
    matcher = grammars.matcher(grammar_text(python_domain.answer_grammar(deduction)))

    def accepts(literal: str) -> bool:
        matcher.reset()
        return matcher.accept_string(f"<answer>{literal}</answer>") and matcher.is_completed()

    return accepts


@settings(max_examples=200, deadline=None)
@given(value=_VALUES)
def test_every_literal_the_python_answer_grammar_means_to_allow_is_in_it(literal_matcher, value):
    assert literal_matcher(repr(value))


@pytest.mark.parametrize("text", ["six", "01", "{[1]}", "[1,", "'a\nb'", "f(3)", "x = 6"])
def test_the_python_answer_grammar_refuses_what_is_not_a_literal(literal_matcher, text):
    assert not literal_matcher(text)


@pytest.mark.parametrize("task_type", ["deduction", "abduction", "induction"])
def test_python_answers_and_proposals_sampled_under_their_grammars_are_always_readable(
    python_domain, tiny_model_dir, tokenizer, task_type
):
    """The untrained model writes noise, so its samples explore the grammars' corners: every one
    that ends is a readable answer, and every proposal's inputs are literals."""
    from selfplay.backends import SamplingSettings, make_backend
    from selfplay.structured_decoding import grammar_text

    backend = make_backend("hf", str(tiny_model_dir))
    settings = SamplingSettings(max_new_tokens=160, temperature=1.0, seed=3, decoding="structured")
    task = next(t for t in python_domain.seed_tasks() if t.task_type == task_type)
    prompt = tokenizer(task.statement)["input_ids"]
    forms = [python_domain.answer_grammar(task), python_domain.proposal_grammar(task_type)]
    generations = backend.generate([prompt] * 16, settings, None, [grammar_text(f) for f in forms] * 8)
    answers = [g.text for g in generations[0::2] if g.finish_reason == "stop"]
    proposals = [g.text for g in generations[1::2] if g.finish_reason == "stop"]
    assert len(answers) >= 4 and len(proposals) >= 2
    answer_format = python_domain.answer_format
    assert all(python_domain.readable(task, answer_format.extract(text)) for text in answers)
    for text in proposals:
        lines = answer_format.extract(text).splitlines()
        inputs = [line.removeprefix("input: ") for line in lines if line.startswith("input: ")]
        assert lines[0] == "def f(x):" and inputs
        for literal in inputs:
            ast.literal_eval(literal)
