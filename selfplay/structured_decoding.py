"""Structured decoding: sampling that can only write an answer of the form its game declares.

Free-text games (a message to an opponent, a proposed task, a solver's answer) cannot list their
moves, so legal decoding does not apply; but their answers have a form, `<answer>...</answer>`
around a message or `\\boxed{...}` around an expression, and a game that ends at its first
malformed answer teaches a small model little. With `rollout.decoding: structured` each game
declares that form as a grammar (`selfplay.games.answers.AnswerGrammar`, a regular expression or
an EBNF grammar) and the sampler may pick, at each position, only tokens that keep the response
inside it; the content stays free.

The grammar engine is xgrammar, the default engine of vLLM's structured outputs: the vLLM backend
hands the grammar to the engine as a structured-output request, and the transformers backend and
the learner run xgrammar's own matcher and token bitmask over the same grammar, with the same
vocabulary and stop tokens. So every backend and the learner mask the same tokens at each
position: the sampler's log-probabilities are those of the masked (renormalised) distribution,
and the learner scores each response under the masks replayed over it, as legal decoding does
with its choices. As with legal decoding the policy is the masked one, so play and evaluation of
a run trained this way decode the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import xgrammar
from transformers import LogitsProcessor

from selfplay.games.answers import AnswerGrammar


@functools.lru_cache(maxsize=4096)
def grammar_text(grammar: AnswerGrammar) -> str:
    """`grammar` as xgrammar's EBNF: what turns record, the vLLM engine is sent and the learner
    replays (a regular expression is converted by xgrammar itself)."""
    if grammar.ebnf:
        return str(xgrammar.Grammar.from_ebnf(grammar.ebnf))
    return str(xgrammar.Grammar.from_regex(grammar.regex))


class Grammars:
    """Grammars compiled for one tokenizer and vocabulary, and their matchers.

    `vocab_size` is the model's (its output layer's rows), which may exceed the tokenizer's; the
    stop tokens a finished answer may end with are `stop_ids`, the ones the backends stop at."""

    def __init__(self, tokenizer, vocab_size: int, stop_ids: Sequence[int]):
        self.vocab_size = vocab_size
        self.stop_ids = sorted(stop_ids)
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1)

    def matcher(self, grammar: str):
        """A fresh xgrammar matcher of `grammar` (EBNF, as `grammar_text` writes it)."""
        return xgrammar.GrammarMatcher(self.compiler.compile_grammar(grammar), override_stop_tokens=self.stop_ids)

    def bitmask(self, rows: int) -> torch.Tensor:
        return xgrammar.allocate_token_bitmask(rows, self.vocab_size)

    def mask(self, responses: Sequence[Sequence[int]], grammars: Sequence[str]) -> torch.Tensor:
        """(total response tokens, vocab) booleans, the rows of all responses in order: at each
        position the tokens the grammar allowed there, replayed over the response. A response
        without a grammar was sampled freely, and every token is allowed."""
        total = sum(len(r) for r in responses)
        packed = self.bitmask(total)
        packed.fill_(-1)  # every bit set: every token allowed
        row = 0
        for response, grammar in zip(responses, grammars):
            if grammar:
                matcher = self.matcher(grammar)
                for j, token in enumerate(response):
                    matcher.fill_next_token_bitmask(packed, row + j)
                    if not matcher.accept_token(token):
                        raise ValueError(f"token {token} at position {j} of a response breaks its grammar")
            row += len(response)
        return unpacked_bitmask(packed, self.vocab_size)


# Each byte's eight bits, lowest first, as booleans: unpacking a bitmask by lookup makes no
# intermediate wider than its result (a response's mask is a vocabulary wide per token).
_BYTE_BITS = (torch.arange(256).unsqueeze(-1) >> torch.arange(8)) & 1 == 1


def unpacked_bitmask(packed: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """xgrammar's token bitmask (int32 words, token `32 * w + b` in bit `b` of word `w`, stored
    little-endian) as (rows, vocab_size) booleans."""
    as_bytes = packed.contiguous().view(torch.uint8).long()
    return _BYTE_BITS[as_bytes].reshape(packed.shape[0], -1)[:, :vocab_size]


class GrammarLogitsProcessor(LogitsProcessor):
    """For `model.generate`: each row's logits masked to the tokens its grammar allows next, by
    xgrammar's matcher and bitmask. Rows whose answer is complete (their stop token sampled) are
    left alone: generate pads them. One instance per `generate` call."""

    def __init__(self, grammars: Grammars, row_grammars: Sequence[str]):
        self.grammars = grammars
        self.matchers = [grammars.matcher(g) for g in row_grammars]
        self.packed = grammars.bitmask(len(self.matchers))
        self.started = False

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.started:  # the token each row was given last step
            for matcher, token in zip(self.matchers, input_ids[:, -1].tolist()):
                if not matcher.is_terminated() and not matcher.accept_token(token):
                    raise RuntimeError(f"the sampler drew token {token}, which the grammar did not allow")
        self.started = True
        xgrammar.reset_token_bitmask(self.packed)
        for row, matcher in enumerate(self.matchers):
            if not matcher.is_terminated():
                matcher.fill_next_token_bitmask(self.packed, row)
        mask = unpacked_bitmask(self.packed, scores.shape[-1]).to(scores.device)
        return scores.masked_fill(~mask, float("-inf"))
