"""Verifiable task domains for the proposer/solver game.

A domain says how a proposer writes a task, how the task is validated and its answer
computed, what a solver is shown, and how a solver's answer is checked:

- `arithmetic`: expressions over small whole numbers with +, - and *; checked exactly. Small
  models learn it in minutes on CPU, so the quickstart can show the game working.
- `python`: a deterministic function `f(x)` and its inputs, run in the sandbox; the solver
  predicts an output (deduction), finds an input giving an output (abduction) or writes the
  function from input/output pairs (induction), as in Absolute Zero. A task is valid only if
  it parses, runs within the sandbox's limits and gives the same result twice.

A proposal's `key` (its normalised text) measures how diverse the proposals are.
"""

from __future__ import annotations

import ast
import operator
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from selfplay.games.answers import BOXED, AnswerFormat, AnswerGrammar


@dataclass(frozen=True)
class Task:
    task_type: str
    statement: str  # what a solver is shown
    answer: str  # the expected answer (python: the repr of the expected output)
    key: str  # the proposal, normalised
    program: str = ""  # python: the function's source
    inputs: tuple[str, ...] = ()  # python: the input literals
    outputs: tuple[str, ...] = ()  # python: repr of f on each input


class Domain(ABC):
    name: str
    task_types: tuple[str, ...]
    answer_format: AnswerFormat = BOXED
    runs_code = False  # True: the domain is built with a sandbox (`roles/sandbox.py`) to run tasks in

    def metrics(self) -> dict[str, float]:
        """The domain's own figures since they were last read, for TensorBoard."""
        return {}

    @abstractmethod
    def task_help(self, task_type: str) -> str:
        """How the proposer writes a task of `task_type`."""

    @abstractmethod
    def answer_help(self, task: Task) -> str:
        """How a solver writes its answer."""

    @abstractmethod
    def read_proposal(self, text: str, task_type: str) -> Task | None:
        """The validated task `text` proposes, or None if it is not a valid task."""

    @abstractmethod
    def proposal_grammar(self, task_type: str) -> AnswerGrammar:
        """The form of a proposal of `task_type` under structured decoding, free where the task is."""

    @abstractmethod
    def answer_grammar(self, task: Task) -> AnswerGrammar:
        """The form of an answer to `task` under structured decoding, free where the answer is."""

    @abstractmethod
    def readable(self, task: Task, answer: str) -> bool:
        """Whether an answer of the right form can be read from `answer` (else a format error)."""

    @abstractmethod
    def check(self, task: Task, answer: str) -> bool:
        """Whether the readable `answer` solves `task`."""

    @abstractmethod
    def example_proposals(self, rng: np.random.Generator, task_type: str, n: int) -> list[str]:
        """Well-formed proposals, for scripted players and the default model's warm start."""

    @abstractmethod
    def example_answers(self, task: Task, rng: np.random.Generator, n: int) -> list[str]:
        """Well-formed answers (right or wrong), likewise."""

    @abstractmethod
    def seed_tasks(self) -> list[Task]:
        """The tasks a task buffer starts with."""


# -- arithmetic ------------------------------------------------------------------------------

_OPERATORS = {ast.Add: (operator.add, "+"), ast.Sub: (operator.sub, "-"), ast.Mult: (operator.mul, "*")}
_INTEGER = re.compile(r"^\s*(-?\d{1,7})\s*$")


class Arithmetic(Domain):
    name = "arithmetic"
    task_types = ("evaluate",)
    max_number = 20
    numbers = (2, 4)  # how many numbers an expression has, at least and at most

    def task_help(self, task_type: str) -> str:
        low, high = self.numbers
        return (
            f"A task is an arithmetic expression with {low} to {high} whole numbers from 0 to {self.max_number} "
            "and the operators +, - and *."
        )

    def answer_help(self, task: Task) -> str:
        return "The answer is a whole number."

    def read_proposal(self, text: str, task_type: str) -> Task | None:
        try:
            tree = ast.parse(text.strip(), mode="eval").body
            value, count = self._evaluate(tree)
        except (SyntaxError, ValueError, RecursionError):
            return None
        if not self.numbers[0] <= count <= self.numbers[1]:
            return None
        expression = ast.unparse(tree)
        return Task("evaluate", f"What is {expression}?", str(value), expression)

    def _evaluate(self, node: ast.AST) -> tuple[int, int]:
        """(value, count of numbers) of an expression of allowed numbers and operators."""
        if isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value <= self.max_number:
            return node.value, 1
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            (left, a), (right, b) = self._evaluate(node.left), self._evaluate(node.right)
            return _OPERATORS[type(node.op)][0](left, right), a + b
        raise ValueError("not an allowed expression")

    def proposal_grammar(self, task_type: str) -> AnswerGrammar:
        """Every expression of the allowed numbers and operators: each such proposal is valid."""
        number = "|".join(str(n) for n in range(self.max_number + 1))
        low, high = self.numbers
        return AnswerGrammar.around(
            self.answer_format, f"(?:{number})(?: ?[-+*] ?(?:{number})){{{low - 1},{high - 1}}}"
        )

    def answer_grammar(self, task: Task) -> AnswerGrammar:
        return AnswerGrammar.around(self.answer_format, "-?[0-9]{1,7}")

    def readable(self, task: Task, answer: str) -> bool:
        return _INTEGER.match(answer.replace(",", "")) is not None

    def check(self, task: Task, answer: str) -> bool:
        return int(_INTEGER.match(answer.replace(",", ""))[1]) == int(task.answer)

    def example_proposals(self, rng: np.random.Generator, task_type: str, n: int) -> list[str]:
        proposals = []
        for _ in range(n):
            count = int(rng.integers(self.numbers[0], self.numbers[1] + 1))
            numbers = [str(int(x)) for x in rng.integers(0, self.max_number + 1, size=count)]
            signs = [_OPERATORS[op][1] for op in rng.choice(list(_OPERATORS), size=count - 1)]
            proposals.append(" ".join(part for pair in zip(numbers, [*signs, ""]) for part in pair).strip())
        return proposals

    def example_answers(self, task: Task, rng: np.random.Generator, n: int) -> list[str]:
        """The answer and guesses within 10 of it: a base model's rough arithmetic, which the
        default model's warm start gives it, so that solving starts from better than chance."""
        offsets = rng.choice(np.arange(-10, 11), size=n, replace=False)
        offsets[0] = 0
        return [str(int(task.answer) + int(d)) for d in rng.permutation(offsets)]

    def seed_tasks(self) -> list[Task]:
        return [self.read_proposal(text, "evaluate") for text in ("2 + 3", "7 * 3 - 4", "12 - 5 + 8", "4 * 5")]


# -- python ----------------------------------------------------------------------------------

# Structured decoding's forms (xgrammar EBNF): a function `f` of one to eight lines of free text
# (no tag, no line break), and a Python literal, which every string of the rule is: numbers
# without leading zeros, one-line strings, and lists, tuples, sets and dicts of them with
# hashable keys and set members.
_FUNCTION_RULES = r"""
function ::= "def f(x):" ("\n    " [^<>\n]{1,70}){1,8}
"""
_LITERAL_RULES = r"""
literal ::= scalar | "[" items? "]" | "(" tuple_items? ")" | "{" set_items "}" | "{" pairs? "}"
scalar ::= number | string | "True" | "False" | "None"
key ::= number | string
number ::= "-"? integer ("." [0-9]{1,6})?
integer ::= "0" | [1-9] [0-9]{0,8}
string ::= "'" [^'\\\n<>]{0,24} "'" | "\"" [^"\\\n<>]{0,24} "\""
sep ::= "," " "?
items ::= literal (sep literal){0,7}
tuple_items ::= literal "," | literal (sep literal){1,7}
set_items ::= key (sep key){0,7}
pairs ::= key ":" " "? literal (sep key ":" " "? literal){0,7}
"""
_INPUT_LINE = re.compile(r"^\s*input\s*:\s*(.+?)\s*$", re.IGNORECASE)
_FENCE = re.compile(r"^\s*```(?:python)?\s*$")
_SEED_PROGRAMS = (
    ("def f(x):\n    return sorted(x)[::-1]", ("[3, 1, 2]", "[5, 9]", "[]")),
    ("def f(x):\n    return sum(i * i for i in range(x))", ("4", "7", "1")),
    ("def f(x):\n    return x.upper() + x[::-1]", ("'ab'", "'cat'", "''")),
    ("def f(x):\n    return {k: len(k) for k in x}", ("['a', 'bcd']", "['xy']", "[]")),
)


def _literal(text: str) -> object:
    """The Python literal `text` denotes; raises ValueError if it is none."""
    try:
        return ast.literal_eval(text.strip())
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        raise ValueError(f"not a Python literal: {text!r}") from None


class Python(Domain):
    name = "python"
    task_types = ("deduction", "abduction", "induction")
    # Code contains braces, so answers are tagged rather than boxed.
    answer_format = AnswerFormat("<answer>", "</answer>")
    induction_inputs = (3, 5)

    runs_code = True

    def __init__(self, sandbox=None):
        from selfplay.roles.sandbox import shared_sandbox

        self.sandbox = sandbox or shared_sandbox("bubblewrap")

    def metrics(self) -> dict[str, float]:
        return self.sandbox.metrics()

    def task_help(self, task_type: str) -> str:
        count = (
            "3 to 5 lines `input: LITERAL`, each a different input"
            if task_type == "induction"
            else "one line `input: LITERAL`"
        )
        return (
            "A task is a small deterministic Python function `def f(x):` of one argument (no imports, files, "
            f"network or randomness), followed by {count}, where LITERAL is a Python literal such as 3, 'abc' "
            "or [1, 2]."
        )

    def answer_help(self, task: Task) -> str:
        if task.task_type == "induction":
            return "The answer is the source of a Python function `def f(x):` that gives every output shown."
        if task.task_type == "abduction":
            return "The answer is a Python literal x such that f(x) gives the output shown."
        return "The answer is the Python literal that f returns."

    def read_proposal(self, text: str, task_type: str) -> Task | None:
        lines = text.strip().splitlines()
        inputs = tuple(m[1] for m in map(_INPUT_LINE.match, lines) if m)
        program = "\n".join(line for line in lines if not _INPUT_LINE.match(line) and not _FENCE.match(line)).strip()
        wanted = self.induction_inputs if task_type == "induction" else (1, 1)
        if not program or not wanted[0] <= len(inputs) <= wanted[1] or len(set(inputs)) < len(inputs):
            return None
        try:
            for literal in inputs:
                _literal(literal)
            key = ast.unparse(ast.parse(program))
        except (ValueError, SyntaxError, RecursionError):
            return None
        results = self.sandbox.verify_many([(program, "f", literal) for literal in inputs])
        outputs = tuple(r.output for r in results)
        # Outputs are compared as literals, so a task whose output is not one cannot be checked.
        if not all(r.ok for r in results) or not all(map(_is_literal, outputs)):
            return None
        statement = self._statement(task_type, program, inputs, outputs)
        answer = outputs[0] if task_type != "induction" else program
        return Task(task_type, statement, answer, f"{key}\n{inputs}", program, inputs, outputs)

    def _statement(self, task_type: str, program: str, inputs, outputs) -> str:
        code = f"```python\n{program}\n```"
        if task_type == "deduction":
            return f"{code}\nWhat does f({inputs[0]}) return?"
        if task_type == "abduction":
            return f"{code}\nFind an input x for which f(x) returns {outputs[0]}."
        pairs = "\n".join(f"f({i}) = {o}" for i, o in zip(inputs, outputs))
        return f"Write a Python function f(x) such that:\n{pairs}"

    def proposal_grammar(self, task_type: str) -> AnswerGrammar:
        """A function `f` of a few free lines, then its input lines, each a Python literal."""
        low, high = self.induction_inputs if task_type == "induction" else (1, 1)
        content = f'content ::= function ("\\ninput: " literal){{{low},{high}}}'
        return AnswerGrammar.around_rules(self.answer_format, content + _FUNCTION_RULES + _LITERAL_RULES)

    def answer_grammar(self, task: Task) -> AnswerGrammar:
        """A function's source for induction; otherwise a Python literal."""
        if task.task_type == "induction":
            return AnswerGrammar.around_rules(self.answer_format, "content ::= function" + _FUNCTION_RULES)
        return AnswerGrammar.around_rules(self.answer_format, "content ::= literal" + _LITERAL_RULES)

    def readable(self, task: Task, answer: str) -> bool:
        text = _unfenced(answer)
        return "def f" in text if task.task_type == "induction" else _is_literal(text)

    def check(self, task: Task, answer: str) -> bool:
        text = _unfenced(answer)
        if task.task_type == "induction":
            results = [self.sandbox.run(text, "f", literal) for literal in task.inputs]
            return all(r.ok and r.output == o for r, o in zip(results, task.outputs))
        value = _literal(text)
        if task.task_type == "deduction":
            return value == _literal(task.answer)
        result = self.sandbox.run(task.program, "f", repr(value))
        return result.ok and result.output == task.answer

    def example_proposals(self, rng: np.random.Generator, task_type: str, n: int) -> list[str]:
        proposals = []
        for _ in range(n):
            program, inputs = _SEED_PROGRAMS[int(rng.integers(len(_SEED_PROGRAMS)))]
            chosen = inputs if task_type == "induction" else inputs[int(rng.integers(len(inputs))) :][:1]
            proposals.append(program + "\n" + "\n".join(f"input: {literal}" for literal in chosen))
        return proposals

    def example_answers(self, task: Task, rng: np.random.Generator, n: int) -> list[str]:
        if task.task_type == "induction":
            return [_SEED_PROGRAMS[int(rng.integers(len(_SEED_PROGRAMS)))][0] for _ in range(n)]
        return [repr(int(x)) for x in rng.integers(-10, 100, size=n)]

    def seed_tasks(self) -> list[Task]:
        tasks = []
        for program, inputs in _SEED_PROGRAMS:
            for task_type in self.task_types:
                chosen = inputs if task_type == "induction" else inputs[:1]
                text = program + "\n" + "\n".join(f"input: {literal}" for literal in chosen)
                task = self.read_proposal(text, task_type)
                if task is not None:
                    tasks.append(task)
        return tasks


def _unfenced(text: str) -> str:
    return "\n".join(line for line in text.strip().splitlines() if not _FENCE.match(line))


def _is_literal(text: str) -> bool:
    try:
        _literal(text)
    except ValueError:
        return False
    return True


DOMAINS = {"arithmetic": Arithmetic, "python": Python}
