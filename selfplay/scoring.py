"""Log-probabilities of given responses under a causal LM: what the learner trains through,
what the warm start fits, and what exploitability probes read move probabilities from; and the
device and precision those passes run at."""

from __future__ import annotations

import contextlib
import platform
import sys
from collections.abc import Sequence

import torch

from selfplay.legal_decoding import Choices, allowed_mask, masked_log_softmax


def pick_device(device: str | None = None) -> str:
    """`device`, or where it is None the GPU if torch sees one, else the CPU."""
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def autocast(precision: str, device_type: str):
    """The context that runs a forward pass at `precision`: "bf16" autocasts matrix products to
    bfloat16 (weights and optimizer state stay fp32), "fp32" changes nothing."""
    if precision == "bf16":
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def bf16_is_native(device_type: str) -> bool:
    """Whether `device_type` computes in bfloat16 in hardware. An x86 CPU does only with
    AVX512-BF16 or AMX instructions; without them PyTorch emulates bf16, many times slower than
    fp32. Other CPUs and accelerators count as native (nothing here tells)."""
    if device_type != "cpu" or platform.machine().lower() not in ("x86_64", "amd64"):
        return True
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def warn_if_bf16_emulated(settings: dict[str, tuple[str, str | None]]) -> None:
    """Print to stderr a warning naming the `settings` (option or config key: (precision, device;
    None where unknown)) that would run bf16 on a CPU without bfloat16 instructions, where they
    make a run many times slower; nothing when there are none."""
    slow = [
        name
        for name, (precision, device) in settings.items()
        if precision == "bf16" and device is not None and not bf16_is_native(torch.device(device).type)
    ]
    if not slow:
        return
    print(
        f"warning: {' and '.join(f'{name}=bf16' for name in slow)} on a CPU without bfloat16 instructions "
        "(AVX512-BF16 or AMX). PyTorch emulates bf16 there: a learner step of the default model took about 15 "
        "times as long as in fp32, and a forward pass with bf16 weights about 5 times. "
        f"Set {' and '.join(f'{name}=fp32' for name in slow)} on this machine.",
        file=sys.stderr,
    )


def response_hidden(model, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]) -> torch.Tensor:
    """The last hidden state at every position that predicts a response token, all responses
    concatenated in order: shape (total response tokens, hidden size).

    The prompts' common prefix (a game's rules, in practice most of the prompt) runs once and
    its keys and values are repeated across the batch; gradients through it are the same as
    running it per row. The rest is right-padded: padding comes after every real token, so
    causal attention keeps it out without a mask and positions match those at sampling time.
    """
    device = next(model.parameters()).device
    decoder = model.get_decoder()
    first = prompts[0]
    shared = min(len(p) for p in prompts) - 1
    for prompt in prompts[1:]:
        shared = next((i for i in range(shared) if prompt[i] != first[i]), shared)
    cache = None
    if shared > 0:
        prefix = torch.tensor([list(first[:shared])], device=device)
        cache = decoder(input_ids=prefix, use_cache=True).past_key_values
        cache.batch_repeat_interleave(len(prompts))
    width = max(len(p) + len(r) for p, r in zip(prompts, responses)) - 1 - shared
    rest = torch.zeros((len(prompts), width), dtype=torch.long)
    rows, cols = [], []
    for row, (prompt, response) in enumerate(zip(prompts, responses)):
        sequence = [*prompt, *response][shared:-1]
        rest[row, : len(sequence)] = torch.tensor(sequence)
        rows += [row] * len(response)
        cols += range(len(prompt) - 1 - shared, len(prompt) - 1 - shared + len(response))
    hidden = decoder(input_ids=rest.to(device), past_key_values=cache, use_cache=cache is not None).last_hidden_state
    return hidden[rows, cols]


def response_logprobs(
    model,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    temperature: float = 1.0,
    choices: Sequence[Choices] | None = None,
) -> list[torch.Tensor]:
    """log softmax(logits / T) of each response token given its prompt, one tensor per pair;
    with `choices` (one per response, empty for a freely sampled one), softmax over the tokens
    legal decoding allowed at each position. Gradients flow when the caller has them enabled."""
    return response_logprobs_and_entropy(model, prompts, responses, temperature, choices, entropy=False)[0]


def response_logprobs_and_entropy(
    model,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    temperature: float = 1.0,
    choices: Sequence[Choices] | None = None,
    entropy: bool = True,
) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """`response_logprobs`, and the entropy of the (legal decoding's renormalised) next-token
    distribution at each of those positions (None when `entropy` is off)."""
    # The output head runs on response positions only: over whole prompts it is most of the cost.
    logits = model.get_output_embeddings()(response_hidden(model, prompts, responses)).float()
    if temperature not in (0, 1):
        logits = logits / temperature
    targets = torch.tensor([t for r in responses for t in r], device=logits.device)
    lengths = [len(r) for r in responses]
    if choices is not None and any(choices):
        mask = allowed_mask(responses, choices, logits.shape[-1]).to(logits.device)
        all_logprobs = masked_log_softmax(logits, mask)
    else:
        mask = None
        all_logprobs = torch.log_softmax(logits, dim=-1)
    token_logprobs = all_logprobs.gather(-1, targets[:, None]).squeeze(-1)
    entropies = None
    if entropy:
        # Tokens legal decoding did not allow have log-probability -inf: read as 0, they add
        # nothing to the entropy, and no NaN (0 * -inf) reaches its value or its gradient.
        finite = all_logprobs if mask is None else all_logprobs.masked_fill(~mask, 0.0)
        entropies = list((-(finite.exp() * finite).sum(-1)).split(lengths))
    return list(token_logprobs.split(lengths)), entropies
