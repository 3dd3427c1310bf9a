"""The policy-backend interface: batched generation with the sampler's log-probabilities,
and in-place weight updates.

Prompts go in as token ids, so that the exact ids the sampler saw are the ids the learner
trains on. Weights come in as a stream of (name, tensor) pairs under the base model's Hugging
Face names (`load_state`: a learner's weights, never whole on one device nor written to a file
on the way), or as a safetensors file (`load_weights`: a league snapshot).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from selfplay.files import published
from selfplay.legal_decoding import Choices

# A model's weights under its Hugging Face names: (name, tensor) pairs, or a mapping of them.
Weights = Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]
Layout = list[tuple[str, str, tuple[int, ...]]]  # a packed bucket's tensors: name, dtype, shape, in order
# The most bytes of a weights stream sent as one piece: few enough pieces for a large model (a
# 7B model in bf16 is about 60), and small beside the memory of the machines that send them.
WEIGHT_BUCKET_BYTES = 256 << 20
# Each packed tensor starts at a multiple of this many bytes, so that it can be viewed in place
# as any dtype.
PACKED_ALIGNMENT = 16


# free: any tokens; legal: only answers naming a legal move (`selfplay.legal_decoding`);
# structured: only answers of the form the game declares (`selfplay.structured_decoding`).
Decoding = Literal["free", "legal", "structured"]
DECODINGS: tuple[Decoding, ...] = ("free", "legal", "structured")


@dataclass(frozen=True)
class SamplingSettings:
    """How to sample one batch. `temperature=0` is greedy. Under `decoding="legal"` the rollout
    engine gives the backend each prompt's choices, under `"structured"` each prompt's grammar;
    top_p applies to free decoding only."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    decoding: Decoding = "free"


@dataclass(frozen=True)
class Generation:
    """One sampled response."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # the sampler's log-probability of each token
    text: str
    finish_reason: str  # "stop" (end-of-sequence token) or "length" (hit max_new_tokens)
    policy_version: int


class PolicyBackend(ABC):
    """Serves one policy: generates for batches of prompts; takes new weights in place."""

    model_path: str
    version: int = 0
    shares_model: bool = False  # generates with the learner's own in-memory model: nothing to load

    @abstractmethod
    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingSettings,
        choices: list[Choices] | None = None,
        grammars: list[str] | None = None,
    ) -> list[Generation]:
        """One response per prompt (token ids), in order. Same seed and prompts, same output.
        With `choices` (legal decoding), each response is one of its prompt's choices; with
        `grammars` (structured decoding, EBNF as `selfplay.structured_decoding.grammar_text`
        writes it), each response stays inside its prompt's grammar."""

    def generate_as_completed(
        self,
        prompts: list[list[int]],
        sampling: SamplingSettings,
        choices: list[Choices] | None = None,
        grammars: list[str] | None = None,
    ) -> Iterator[list[tuple[int, Generation]]]:
        """The responses `generate` gives, handed over as they finish: groups of (prompt index,
        generation), each group what finished together. A caller can work on early finishers
        while the rest are still sampling. Backends that sample the whole batch at once hand
        it over as one group."""
        yield list(enumerate(self.generate(prompts, sampling, choices, grammars)))

    def clear_prefix_cache(self) -> None:
        """Forget every cached prompt prefix, so the next batch computes its prompts in full.
        Backends that cache nothing across calls have nothing to do."""
        return None

    @abstractmethod
    def load_state(self, weights: Weights, version: int) -> None:
        """Serve `weights` from now on, as `version`: (name, tensor) pairs under the base model's
        Hugging Face names, each of the model's tensors once (tied embeddings under one name).

        The stream is read once, in order and to its end: each tensor may come from a
        collective that every rank of a sharded learner takes part in. No more than a bucket
        of it (WEIGHT_BUCKET_BYTES) stays on the device that made it; the rest waits in host
        memory until the stream is whole, and then the backend takes all of it at once. A
        stream that breaks off, or that `checked_weights` refuses, leaves the previous weights
        serving."""

    @abstractmethod
    def load_weights(self, path: Path, version: int) -> None:
        """Serve the weights in the safetensors file `path` from now on, as `version`."""

    def release_memory(self) -> None:  # noqa: B027 (optional: only engines that reserve a GPU need it)
        """Free the device memory generation holds (an engine's weights and KV cache) while a
        learner on the same GPU updates; the next `load_state` takes it back. Backends that hold
        none apart from their weights have nothing to do."""

    def close(self) -> None:  # noqa: B027 (optional: only engines with processes need it)
        """Release the engine's processes and memory."""


def stop_ids(tokenizer, generation_config) -> frozenset[int]:
    """The tokens a response ends at: the tokenizer's end-of-sequence token and the model's
    generation config's (which may name several, as chat models' do)."""
    eos = generation_config.eos_token_id if generation_config is not None else None
    ids = set(eos if isinstance(eos, list) else [eos]) | {tokenizer.eos_token_id}
    ids.discard(None)
    return frozenset(ids)


def cut_at_stop(tokens: list[int], logprobs: list[float], eos_ids, tokenizer, version: int) -> Generation:
    """A `Generation` from sampled tokens: cut after the first stop token, which stays in the
    record (the learner trains on the decision to stop) but not in the text."""
    stop = next((i for i, t in enumerate(tokens) if t in eos_ids), None)
    if stop is None:
        kept, finish_reason, text_tokens = len(tokens), "length", tokens
    else:
        kept, finish_reason, text_tokens = stop + 1, "stop", tokens[:stop]
    return Generation(
        token_ids=tuple(tokens[:kept]),
        logprobs=tuple(logprobs[:kept]),
        text=tokenizer.decode(text_tokens),
        finish_reason=finish_reason,
        policy_version=version,
    )


def save_weights(weights, path: Path) -> Path:
    """Write weights where `PolicyBackend.load_weights` reads them: a safetensors file, written
    to a temporary name and renamed so no reader sees half a file (`selfplay.files.published`;
    a failed write raises WriteError). `weights` is a torch model (its tied tensors are written
    once) or a mapping of names to tensors, each written once."""
    from safetensors.torch import save_file, save_model

    with published(path, "the weights file") as partial:
        if isinstance(weights, Mapping):
            save_file({name: tensor.contiguous() for name, tensor in weights.items()}, str(partial), {"format": "pt"})
        else:
            save_model(weights, str(partial))
    return Path(path)


def _weight_pairs(weights: Weights) -> Iterable[tuple[str, torch.Tensor]]:
    """`weights` as (name, tensor) pairs: a mapping's items, or the pairs themselves."""
    return weights.items() if isinstance(weights, Mapping) else weights


def checked_weights(model: torch.nn.Module, weights: Weights) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    """Each (name, tensor) of `weights` with the tensor of `model` it replaces (a parameter or a
    persistent buffer; a model on the meta device will do), checked as it comes. A name the
    model lacks, a shape not the model's, a tensor given twice (tied names are one tensor), or a
    stream that ends without one of the model's tensors raises ValueError naming it."""
    targets = model.state_dict(keep_vars=True)
    names: dict[int, list[str]] = defaultdict(list)  # each distinct tensor's names (several if tied)
    for name, target in targets.items():
        names[id(target)].append(name)
    given: dict[int, str] = {}  # each tensor given so far -> the name it came under
    for name, tensor in _weight_pairs(weights):
        target = targets.get(name)
        if target is None:
            raise ValueError(f"The weights give '{name}', a tensor the model does not have.")
        if tensor.shape != target.shape:
            raise ValueError(
                f"The weights give '{name}' the shape {tuple(tensor.shape)}; the model's is {tuple(target.shape)}."
            )
        if id(target) in given:
            earlier = given[id(target)]
            tied = "" if earlier == name else f" (as '{earlier}', which is tied to it)"
            raise ValueError(f"The weights give '{name}' twice{tied}: give each tensor once.")
        given[id(target)] = name
        yield name, tensor, target
    missing = [tensor_names[0] for key, tensor_names in names.items() if key not in given]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ValueError(
            f"The weights ended without {len(missing)} of the model's tensors: {', '.join(missing[:5])}{more}."
        )


def weight_buckets(weights: Weights, max_bytes: int = WEIGHT_BUCKET_BYTES) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """`weights` in order, in consecutive buckets of at most `max_bytes` (a larger tensor alone)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in _weight_pairs(weights):
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > max_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def packed(bucket: list[tuple[str, torch.Tensor]], device: torch.device | str = "cpu") -> tuple[Layout, torch.Tensor]:
    """`bucket` as its layout and one flat uint8 tensor on `device` holding the tensors' bytes
    end to end (one copy): what crosses processes, without pickling a tensor each. Packed
    buckets end to end are the packing of them all."""
    layout = [(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape)) for name, tensor in bucket]
    spans, size = _spans(layout)
    flat = torch.empty(size, dtype=torch.uint8, device=device)
    for (start, length), (_, tensor) in zip(spans, bucket):
        flat[start : start + length] = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    return layout, flat


def unpacked(layout: Layout, flat: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """The tensors `packed` laid out in `flat`, as views of it (no copy)."""
    spans, _ = _spans(layout)
    return [
        (name, flat[start : start + length].view(getattr(torch, dtype)).view(shape))
        for (name, dtype, shape), (start, length) in zip(layout, spans)
    ]


def _spans(layout: Layout) -> tuple[list[tuple[int, int]], int]:
    """Where each tensor of `layout` lies in its packed bytes (start, length), and their size."""
    spans, end = [], 0
    for _, dtype, shape in layout:
        length = math.prod(shape) * getattr(torch, dtype).itemsize
        spans.append((end, length))
        end += -(-length // PACKED_ALIGNMENT) * PACKED_ALIGNMENT
    return spans, end
