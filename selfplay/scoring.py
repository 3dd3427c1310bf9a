"""Log-probabilities of given responses under a causal LM: what the learner trains through,
what the warm start fits, and what exploitability probes read move probabilities from; and the
device and precision those passes run at."""

from __future__ import annotations

import contextlib
import platform
import sys
from collections.abc import Sequence

import torch

from selfplay.legal_decoding import masked_log_softmax


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


def response_hidden(
    model, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], share_prefix: bool = True
) -> torch.Tensor:
    """The last hidden state at every position that predicts a response token, all responses
    concatenated in order: shape (total response tokens, hidden size).

    The prompts' common prefix (a game's rules, in practice most of the prompt) runs once and
    its keys and values are repeated across the batch; gradients through it are the same as
    running it per row. A prompt that several responses share (a GRPO group's samples, a probe
    scoring every legal move of a state) runs once too, its responses after it; gradients
    through it are again those of whole rows, and the same to the bit on every repeat, on one
    thread or several (a resumed run must repeat the run it resumes).

    `share_prefix=False` runs every row whole, each layer once per call: a sharded model
    (`selfplay.sharding`) gathers each layer once per forward pass and frees it after, so a
    second pass through a layer would find its weights freed in the backward pass, and every
    process must run the same passes.
    """
    device = next(model.parameters()).device
    decoder = model.get_decoder()
    if decoder.training and getattr(decoder, "gradient_checkpointing", False):
        share_prefix = False  # a decoder recomputing its activations keeps no key/value cache
    first = prompts[0]
    shared = min(len(p) for p in prompts) - 1 if share_prefix else 0
    for prompt in prompts[1:]:
        shared = next((i for i in range(shared) if prompt[i] != first[i]), shared)
    distinct = {tuple(prompt): None for prompt in prompts}
    whole_rows = len(distinct) == len(prompts) or not share_prefix
    cache = None
    if shared > 0:
        prefix = torch.tensor([list(first[:shared])], device=device)
        cache = decoder(input_ids=prefix, use_cache=True).past_key_values
        cache.batch_repeat_interleave(len(prompts) if whole_rows else len(distinct))
    if whole_rows:
        return _whole_rows_hidden(decoder, prompts, responses, shared, cache)
    return _shared_prompts_hidden(decoder, list(distinct), prompts, responses, shared, cache)


def _right_padded(rows: Sequence[Sequence[int]], width: int) -> torch.Tensor:
    padded = torch.zeros((len(rows), width), dtype=torch.long)
    for row, tokens in enumerate(rows):
        padded[row, : len(tokens)] = torch.tensor(list(tokens), dtype=torch.long)
    return padded


def _whole_rows_hidden(decoder, prompts, responses, shared: int, cache) -> torch.Tensor:
    """Each row's prompt (after the shared prefix) and response in one pass. Rows are
    right-padded: padding comes after every real token, so causal attention keeps it out
    without a mask and positions match those at sampling time."""
    device = decoder.device
    sequences = [[*prompt, *response][shared:-1] for prompt, response in zip(prompts, responses)]
    rows, cols = [], []
    for row, (prompt, response) in enumerate(zip(prompts, responses)):
        rows += [row] * len(response)
        cols += range(len(prompt) - 1 - shared, len(prompt) - 1 - shared + len(response))
    rest = _right_padded(sequences, max(map(len, sequences))).to(device)
    hidden = decoder(input_ids=rest, past_key_values=cache, use_cache=cache is not None).last_hidden_state
    return hidden[rows, cols]


def _shared_prompts_hidden(decoder, distinct, prompts, responses, shared: int, cache) -> torch.Tensor:
    """Each distinct prompt once (after the shared prefix), then every response after its own
    prompt's keys and values. Prompts differ in length, so the responses' pass masks the
    padding between a prompt's end and its response and numbers positions from the prompt's
    end, as sampling did."""
    device = decoder.device
    index = {prompt: i for i, prompt in enumerate(distinct)}
    of_row = torch.tensor([index[tuple(prompt)] for prompt in prompts], device=device)
    suffixes = [prompt[shared:] for prompt in distinct]
    width = max(map(len, suffixes))
    out = decoder(input_ids=_right_padded(suffixes, width).to(device), past_key_values=cache, use_cache=True)
    # Rows take their prompt's states by index_select, whose backward adds up a prompt's rows in
    # order: an indexing gather's backward adds them as several threads reach them, and its bits
    # would change from run to run. The hidden state after each prompt's last token predicts its
    # responses' first token.
    ends = [len(prompts[row]) - shared - 1 for row in range(len(prompts))]
    at_ends = of_row * width + torch.tensor(ends, device=device)
    first_tokens = out.last_hidden_state.flatten(0, 1).index_select(0, at_ends)
    longest = max(map(len, responses)) - 1
    if longest == 0:
        return first_tokens
    cache = out.past_key_values
    for layer in cache.layers:  # each row its prompt's keys and values
        layer.keys, layer.values = layer.keys.index_select(0, of_row), layer.values.index_select(0, of_row)
    mask = torch.zeros((len(prompts), shared + width + longest), dtype=torch.long)
    mask[:, :shared] = 1
    for row, end in enumerate(ends):
        mask[row, shared : shared + end + 1] = 1
    mask[:, shared + width :] = 1
    positions = torch.tensor([len(prompt) for prompt in prompts])[:, None] + torch.arange(longest)
    rest = decoder(
        input_ids=_right_padded([response[:-1] for response in responses], longest).to(device),
        attention_mask=mask.to(device),
        position_ids=positions.to(device),
        past_key_values=cache,
    ).last_hidden_state
    hidden = []
    for row, response in enumerate(responses):
        hidden += [first_tokens[row : row + 1], rest[row, : len(response) - 1]]
    return torch.cat(hidden)


def vocab_size(model) -> int:
    """The rows of the model's output layer: the size of a next-token distribution (and of a
    decoding mask), which may exceed the tokenizer's."""
    return model.get_output_embeddings().weight.shape[0]


def response_logprobs(
    model,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    temperature: float = 1.0,
    mask: torch.Tensor | None = None,
    top_p: float = 1.0,
) -> list[torch.Tensor]:
    """log softmax(logits / T) of each response token given its prompt, one tensor per pair;
    with `mask` ((total response tokens, vocab) booleans, the rows of the responses in order:
    `allowed_mask` of legal decoding, `Grammars.mask` of structured decoding), softmax over the
    tokens allowed at each position; with `top_p` below 1 (and no mask), over each position's
    nucleus (`nucleus_mask`), as a sampler with that top_p draws. Gradients flow when the caller
    has them enabled."""
    return response_logprobs_and_entropy(model, prompts, responses, temperature, mask, entropy=False, top_p=top_p)[0]


def nucleus_mask(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """The tokens top-p sampling keeps at each row of `logits` (already divided by the
    temperature), as transformers' TopPLogitsWarper and vLLM keep them: all but the least
    probable tokens whose probabilities sum to at most 1 - top_p, and always the most probable."""
    ascending, order = torch.sort(logits, dim=-1)
    dropped = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
    dropped[..., -1] = False
    return ~dropped.scatter(-1, order, dropped)


def response_logprobs_and_entropy(
    model,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    temperature: float = 1.0,
    mask: torch.Tensor | None = None,
    entropy: bool = True,
    share_prefix: bool = True,
    top_p: float = 1.0,
) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """`response_logprobs`, and the entropy of the (masked, renormalised) next-token
    distribution at each of those positions (None when `entropy` is off). `share_prefix`: see
    `response_hidden`."""
    # The output head runs on response positions only: over whole prompts it is most of the cost.
    hidden = response_hidden(model, prompts, responses, share_prefix)
    logits = model.get_output_embeddings()(hidden).float()
    if temperature not in (0, 1):
        logits = logits / temperature
    targets = torch.tensor([t for r in responses for t in r], device=logits.device)
    lengths = [len(r) for r in responses]
    if mask is None and top_p < 1:
        mask = nucleus_mask(logits, top_p)
    if mask is not None:
        mask = mask.to(logits.device)
        all_logprobs = masked_log_softmax(logits, mask)
    else:
        all_logprobs = torch.log_softmax(logits, dim=-1)
    token_logprobs = all_logprobs.gather(-1, targets[:, None]).squeeze(-1)
    entropies = None
    if entropy:
        # Tokens the mask did not allow have log-probability -inf: read as 0, they add
        # nothing to the entropy, and no NaN (0 * -inf) reaches its value or its gradient.
        finite = all_logprobs if mask is None else all_logprobs.masked_fill(~mask, 0.0)
        entropies = list((-(finite.exp() * finite).sum(-1)).split(lengths))
    return list(token_logprobs.split(lengths)), entropies
