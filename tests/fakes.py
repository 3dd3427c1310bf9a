"""A stand-in policy backend for testing the rollout engine without a trained model."""

from __future__ import annotations

import random
import re

from selfplay.backends import Generation, PolicyBackend, SamplingSettings

_LEGAL = re.compile(r"Legal moves: (.*)")


class LegalMoveBackend(PolicyBackend):
    """Answers every prompt with a random legal move read from the prompt's 'Legal moves:'
    line (or 'pass' when there is none), and logs the size of every batch it is sent."""

    def __init__(self, tokenizer, seed: int = 0):
        self.tokenizer = tokenizer
        self.model_path = "legal-move-fake"
        self.rng = random.Random(seed)
        self.batch_sizes: list[int] = []

    def generate(
        self, prompts: list[list[int]], sampling: SamplingSettings, choices=None, grammars=None
    ) -> list[Generation]:
        self.batch_sizes.append(len(prompts))
        if choices is not None:  # legal decoding: one of the choices
            picked = [self.rng.choice(options) for options in choices]
            return [
                Generation(ids, (-0.5,) * len(ids), self.tokenizer.decode(ids[:-1]), "stop", self.version)
                for ids in picked
            ]
        return [self._answer(self.tokenizer.decode(prompt)) for prompt in prompts]

    def _answer(self, prompt: str) -> Generation:
        lines = _LEGAL.findall(prompt)
        move = self.rng.choice(lines[-1].split(", ")) if lines else "pass"
        text = f"I choose \\boxed{{{move}}}"
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        return Generation(tuple(ids), tuple([-0.5] * len(ids)), text, "stop", self.version)

    def load_state(self, weights, version: int) -> None:
        for _ in weights:  # read to its end, as every backend reads a stream
            pass
        self.version = version

    def load_weights(self, path, version: int) -> None:
        self.version = version


class CountingTokenizer:
    """A tokenizer that counts how often it is called to encode text."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self._tokenizer(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


class ShuffledHandoverBackend(LegalMoveBackend):
    """A `LegalMoveBackend` that hands each batch over as an engine sampling in steps does:
    in groups of random size, in random order (drawn from `handover_seed`). Notes, for each
    batch, how many times its tokenizer had been called at each handover."""

    def __init__(self, tokenizer, seed: int = 0, handover_seed: int = 0):
        super().__init__(CountingTokenizer(tokenizer), seed)
        self.handover_rng = random.Random(handover_seed)
        self.tokenizer_calls_at_handovers: list[list[int]] = []

    def generate_as_completed(self, prompts, sampling, choices=None, grammars=None):
        pending = list(enumerate(self.generate(prompts, sampling, choices, grammars)))
        self.handover_rng.shuffle(pending)
        calls: list[int] = []
        self.tokenizer_calls_at_handovers.append(calls)
        while pending:
            size = self.handover_rng.randint(1, len(pending))
            calls.append(self.tokenizer.calls)
            yield pending[:size]
            pending = pending[size:]
