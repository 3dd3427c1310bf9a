"""The KL reference's log-probabilities of turns already scored.

The reference (the base model under a LoRA learner's adapters, or a full fine-tune's frozen
copy) does not change while it stays where it is, so a turn it has scored once never needs its
forward pass again. Self-play meets the same turns step after step (a Kuhn Poker step plays its
24 (state, move) pairs hundreds of times), and with a real model the reference pass is a fifth of
a step. The cache keeps the most recently used entries, at most `capacity`; moving the reference
empties it. It is part of the training state, so that a resumed run scores the same turns the
unbroken run would have and repeats it to the bit (a turn scored in another batch may differ in
its last bits).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

FILE = "reference_logprobs.safetensors"
CAPACITY = 65_536  # turns; each holds a 16-byte key and 4 bytes a response token


def turn_key(prompt_ids: Sequence[int], response_ids: Sequence[int], choices, grammar: str) -> bytes:
    """What fixes a turn's reference log-probabilities: its tokens and the mask it was sampled
    under (legal decoding's choices, structured decoding's grammar)."""
    turn = repr((tuple(prompt_ids), tuple(response_ids), choices, grammar)).encode()
    return hashlib.blake2b(turn, digest_size=16).digest()


class ReferenceCache:
    def __init__(self, capacity: int = CAPACITY):
        self.capacity = capacity
        self.entries: OrderedDict[bytes, torch.Tensor] = OrderedDict()  # least recently used first

    def __len__(self) -> int:
        return len(self.entries)

    def found(self, keys: Sequence[bytes]) -> dict[bytes, torch.Tensor]:
        """The entries of `keys` the cache holds, each now the most recently used."""
        hits = {}
        for key in dict.fromkeys(keys):
            if key in self.entries:
                self.entries.move_to_end(key)
                hits[key] = self.entries[key]
        return hits

    def add(self, scored: dict[bytes, torch.Tensor]) -> None:
        for key, logprobs in scored.items():
            self.entries[key] = logprobs.detach().float().cpu()
            self.entries.move_to_end(key)
        while len(self.entries) > self.capacity:
            self.entries.popitem(last=False)

    def clear(self) -> None:
        self.entries.clear()

    def save(self, directory: Path) -> None:
        """Three tensors, the entries in order of use: their keys, their lengths, and their
        log-probabilities end to end."""
        keys = torch.frombuffer(bytearray(b"".join(self.entries)), dtype=torch.uint8).view(len(self.entries), -1)
        save_file(
            {
                "keys": keys,
                "lengths": torch.tensor([len(logprobs) for logprobs in self.entries.values()]),
                "logprobs": torch.cat(list(self.entries.values())),
            },
            str(directory / FILE),
        )

    def load(self, directory: Path) -> None:
        """The entries `save` wrote in `directory`; none where it wrote none (a checkpoint from
        before the cache, or of a learner without a KL reference)."""
        self.clear()
        if (directory / FILE).exists():
            saved = load_file(str(directory / FILE))
            keys = [bytes(row) for row in saved["keys"].tolist()]
            self.add(dict(zip(keys, saved["logprobs"].split(saved["lengths"].tolist()))))
