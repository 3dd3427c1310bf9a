"""Legal decoding: sampling that can only write an answer naming a legal move.

A game's legal moves, each written in its answer format and followed by the end-of-turn token,
form a small tree of token ids (the `Choices` of a turn). With `rollout.decoding: legal` the
sampler may pick, at each position of a response, only the tokens that continue some legal
answer, the model's probabilities renormalised over them. This is action masking for a language
model policy, normalised token by token as TWOSOME (Tan et al., 2024) does. The learner scores
the same renormalised distribution, so sampler and learner agree; a position with one allowed
token has probability 1 and no gradient, so the policy learns only where legal answers part.

A small model then spends none of its training on learning which moves are legal, and no game is
lost to an invalid move. The cost is that the policy is the masked one: play and evaluation use
legal decoding too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

Choices = tuple[tuple[int, ...], ...]  # each legal answer's token ids, ending with end-of-turn


def answer_choices(answers: Sequence[str], tokenizer, eos_id: int, cache: dict[str, tuple[int, ...]]) -> Choices:
    """The `Choices` of a turn whose legal answers are `answers`; `cache` keeps each answer's ids
    across calls (a game has few distinct answers)."""
    new = [a for a in dict.fromkeys(answers) if a not in cache]
    if new:
        for answer, ids in zip(new, tokenizer(new, add_special_tokens=False)["input_ids"]):
            cache[answer] = (*ids, eos_id)
    return tuple(dict.fromkeys(cache[a] for a in answers))


def allowed_tokens(choices: Choices, prefix: Sequence[int]) -> tuple[int, ...]:
    """The tokens that may follow `prefix`: the next token of every choice that starts with it
    (none once `prefix` is a whole choice)."""
    depth = len(prefix)
    prefix = tuple(prefix)
    return tuple(dict.fromkeys(c[depth] for c in choices if len(c) > depth and c[:depth] == prefix))


def advance_forced(
    responses: list[list[int]], logprobs: list[list[float]], choices: Sequence[Choices]
) -> tuple[list[int], list[tuple[int, ...]]]:
    """One round of legal decoding's bookkeeping: append every token that is the only one allowed
    (log-probability 0) to the responses being written, and return the rows now waiting on a
    choice between several tokens, with those tokens. No rows: every response is complete."""
    waiting, allowed = [], []
    for row, (response, options) in enumerate(zip(responses, choices)):
        while len(tokens := allowed_tokens(options, response)) == 1:
            response.append(tokens[0])
            logprobs[row].append(0.0)
        if tokens:
            waiting.append(row)
            allowed.append(tokens)
    return waiting, allowed


# (rows, their responses so far, their allowed tokens, round) -> one (token, log-probability) per row
TokenSampler = Callable[[list[int], list[list[int]], list[tuple[int, ...]], int], list[tuple[int, float]]]


def legal_decode(choices: Sequence[Choices], sample: TokenSampler) -> tuple[list[list[int]], list[list[float]]]:
    """Write one of its choices for every prompt, and the log-probability of each token:
    `advance_forced` between rounds, and in each round `sample(rows, written, allowed, round)`
    draws one token, with its log-probability, for every waiting row (an index into `choices`)
    from among its allowed tokens, after its prompt and the response written so far."""
    responses: list[list[int]] = [[] for _ in choices]
    logprobs: list[list[float]] = [[] for _ in choices]
    round_ = 0
    while True:
        waiting, allowed = advance_forced(responses, logprobs, choices)
        if not waiting:
            return responses, logprobs
        written = [responses[row] for row in waiting]
        for row, (token, logp) in zip(waiting, sample(waiting, written, allowed, round_)):
            responses[row].append(token)
            logprobs[row].append(logp)
        round_ += 1


def allowed_mask(responses: Sequence[Sequence[int]], choices: Sequence[Choices], vocab_size: int) -> torch.Tensor:
    """(total response tokens, vocab) booleans, the rows of all responses in order: at each
    position the tokens legal decoding allowed there. A response without choices was sampled
    freely, and every token is allowed."""
    mask = torch.ones((sum(len(r) for r in responses), vocab_size), dtype=torch.bool)
    row = 0
    for response, options in zip(responses, choices):
        if options:
            for j in range(len(response)):
                mask[row + j] = False
                mask[row + j, list(allowed_tokens(options, response[:j]))] = True
        row += len(response)
    return mask


def masked_log_softmax(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log softmax over the allowed entries of each row; -inf elsewhere."""
    return torch.log_softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
