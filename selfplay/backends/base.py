"""The policy-backend interface: batched generation with the sampler's log-probabilities,
and in-place weight updates.

Prompts go in as token ids, so that the exact ids the sampler saw are the ids the learner
trains on. Weights come in as a safetensors file, so a backend in another process (or on
another machine with a shared filesystem) loads them without pickling tensors.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from selfplay.files import published
from selfplay.legal_decoding import Choices


@dataclass(frozen=True)
class SamplingSettings:
    """How to sample one batch. `temperature=0` is greedy. `decoding="legal"` writes only answers
    naming a legal move (`selfplay.legal_decoding`): the rollout engine gives the backend each
    prompt's choices, and top_p does not apply."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    decoding: Literal["free", "legal"] = "free"


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
        self, prompts: list[list[int]], sampling: SamplingSettings, choices: list[Choices] | None = None
    ) -> list[Generation]:
        """One response per prompt (token ids), in order. Same seed and prompts, same output.
        With `choices` (legal decoding), each response is one of its prompt's choices."""

    def generate_as_completed(
        self, prompts: list[list[int]], sampling: SamplingSettings, choices: list[Choices] | None = None
    ) -> Iterator[list[tuple[int, Generation]]]:
        """The responses `generate` gives, handed over as they finish: groups of (prompt index,
        generation), each group what finished together. A caller can work on early finishers
        while the rest are still sampling. Backends that sample the whole batch at once hand
        it over as one group."""
        yield list(enumerate(self.generate(prompts, sampling, choices)))

    def clear_prefix_cache(self) -> None:
        """Forget every cached prompt prefix, so the next batch computes its prompts in full.
        Backends that cache nothing across calls have nothing to do."""
        return None

    @abstractmethod
    def load_weights(self, path: Path, version: int) -> None:
        """Serve the weights in the safetensors file `path` from now on, as `version`."""

    def close(self) -> None:  # noqa: B027 (optional: only engines with processes need it)
        """Release the engine's processes and memory."""


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
