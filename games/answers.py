"""Reading a move out of a model's raw output.

The model writes free text and marks its move with an answer format (by default SPIRAL's
`\\boxed{...}`). Extraction is strict about the marker and lenient about what is inside it:
case, spacing, brackets, quotes and LaTeX `\\text{}` wrappers are ignored.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|texttt)\s*\{([^{}]*)\}")
_EDGE_NOISE = "[](){}<>\"'`*.,;:!?$ \t\n"
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class AnswerFormat:
    """The marker around the move in a model's output; the last marked answer counts."""

    opening: str = "\\boxed{"
    closing: str = "}"

    def wrap(self, move: str) -> str:
        return f"{self.opening}{move}{self.closing}"

    def instruction(self, example: str) -> str:
        return (
            f"Think as much as you need, then put your final move within "
            f"{self.opening}{self.closing}, for example {self.wrap(example)}."
        )

    def extract(self, text: str) -> str | None:
        """The content of the last answer marker in `text`, or None if there is none."""
        start = text.rfind(self.opening)
        if start < 0:
            return None
        start += len(self.opening)
        if self.opening.endswith("{") and self.closing == "}":
            return _balanced_brace_content(text, start)
        end = text.find(self.closing, start)
        return None if end < 0 else text[start:end]


BOXED = AnswerFormat()


@dataclass(frozen=True)
class AnswerGrammar:
    """The form a whole answer must take under structured decoding (`selfplay.structured_decoding`):
    a regular expression, or a grammar in xgrammar's EBNF (GBNF) whose rule `root` is the answer."""

    regex: str = ""
    ebnf: str = ""

    def __post_init__(self):
        if bool(self.regex) == bool(self.ebnf):
            raise ValueError("an AnswerGrammar is a regex or an EBNF grammar: give exactly one")

    @classmethod
    def around(cls, answer_format: AnswerFormat, content: str) -> AnswerGrammar:
        """`answer_format`'s markers around text matching the regular expression `content`."""
        return cls(regex=re.escape(answer_format.opening) + f"(?:{content})" + re.escape(answer_format.closing))

    @classmethod
    def around_rules(cls, answer_format: AnswerFormat, rules: str) -> AnswerGrammar:
        """`answer_format`'s markers around text of the EBNF rule `content`, which `rules` define."""
        opening, closing = (json.dumps(marker) for marker in (answer_format.opening, answer_format.closing))
        return cls(ebnf=f"root ::= {opening} content {closing}\n{rules}")

    @classmethod
    def one_of(cls, answer_format: AnswerFormat, moves: list[str]) -> AnswerGrammar:
        """An answer naming one of `moves`, as `answer_format.wrap` writes it."""
        return cls.around(answer_format, "|".join(re.escape(move) for move in moves))


def _balanced_brace_content(text: str, start: int) -> str | None:
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


def normalize(answer: str) -> str:
    """Canonical form for comparing an answer with a move name."""
    answer = _TEXT_WRAPPER.sub(r"\1", answer)
    answer = _SPACES.sub(" ", answer.lower()).strip(_EDGE_NOISE)
    return answer
