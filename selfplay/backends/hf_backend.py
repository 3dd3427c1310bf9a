"""Generation with Hugging Face transformers, on CPU or GPU: the backend that needs nothing
beyond transformers, and the reference the vLLM backend is checked against."""

from __future__ import annotations

import contextlib
import functools
import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from selfplay.backends.base import (
    Generation,
    PolicyBackend,
    SamplingSettings,
    Weights,
    checked_weights,
    cut_at_stop,
    stop_ids,
)
from selfplay.legal_decoding import Choices, legal_decode, masked_log_softmax
from selfplay.scoring import pick_device, response_hidden, vocab_size
from selfplay.structured_decoding import GrammarLogitsProcessor, Grammars

# Contexts whose final hidden state a frozen backend keeps (least recently used leave first):
# more than TicTacToe's 4,520 decision states under one prompt style.
FROZEN_STATE_CACHE = 8192


# Prompts sharing at least this many leading tokens (a game's rules) are sampled in one batch
# that runs the shared part once.
MIN_SHARED_PREFIX = 32


def common_prefix_length(prompts: list[list[int]]) -> int:
    """How many leading tokens every prompt shares, leaving each at least one of its own."""
    first = prompts[0]
    shared = min(len(p) for p in prompts) - 1
    for prompt in prompts[1:]:
        shared = next((i for i in range(shared) if prompt[i] != first[i]), shared)
    return shared


def length_batches(indices: Iterable[int], prompts: list[list[int]], max_size: int) -> list[list[int]]:
    """`indices` sorted by the length of their prompts, in batches of at most `max_size`: little
    of each batch is padding."""
    order = sorted(indices, key=lambda i: len(prompts[i]))
    return [order[start : start + max_size] for start in range(0, len(order), max_size)]


def prefix_batches(prompts: list[list[int]], max_size: int) -> list[list[int]]:
    """The prompts' indices in batches of at most `max_size`: prompts that share a prefix of
    MIN_SHARED_PREFIX tokens or more batch together (sorted by their tokens, prompts of one game
    are neighbours); those that share none with another batch together. Each batch is sorted by
    length, so that little of it is padding."""
    groups: list[list[int]] = []
    for i in sorted(range(len(prompts)), key=lambda i: prompts[i]):
        group = groups[-1] if groups else None
        if (
            group
            and len(group) < max_size
            and common_prefix_length([prompts[group[0]], prompts[i]]) >= MIN_SHARED_PREFIX
        ):
            group.append(i)
        else:
            groups.append([i])
    shared = [sorted(g, key=lambda i: len(prompts[i])) for g in groups if len(g) > 1]
    return shared + length_batches((g[0] for g in groups if len(g) == 1), prompts, max_size)


class AdapterPool:
    """LoRA adapters saved by peft (league snapshots), served over one peft model's frozen base
    (a LoRA learner's own model): no copy of the model per adapter. Each is loaded beside the
    model's own adapters when first selected, at most `capacity` at once: the least recently
    used is unloaded (peft's `delete_adapter`) and loaded again from its directory when next
    selected. Selecting one never switches the model's active adapter, never makes a loaded
    adapter trainable, and leaves the model in the mode it was in."""

    def __init__(self, model: torch.nn.Module, capacity: int):
        self.model = model
        self.capacity = capacity
        self.resident: OrderedDict[str, None] = OrderedDict()  # least recently used first

    @contextlib.contextmanager
    def selected(self, name: str, directory: Path) -> Iterator[None]:
        """While the block runs, every LoRA layer of the model computes each row of every call
        with the adapter `name` (saved in `directory`) alone, through peft's mixed-batch path
        (its `adapter_names`). Given to each layer, sized to the rows of each call, so that it
        holds whatever runs the model: `generate`, a forward pass, or the decoder alone with a
        prefix run once and then repeated over the batch."""
        from peft.tuners.lora import LoraLayer

        self._load(name, directory)

        def rows_with_adapter(_module, args, kwargs):
            rows = len(args[0] if args else kwargs["x"])
            return args, {**kwargs, "adapter_names": [name] * rows}

        handles = [
            layer.register_forward_pre_hook(rows_with_adapter, with_kwargs=True)
            for layer in self.model.modules()
            if isinstance(layer, LoraLayer)
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _load(self, name: str, directory: Path) -> None:
        if name in self.resident:
            self.resident.move_to_end(name)
            return
        while len(self.resident) >= self.capacity:
            self.unload(next(iter(self.resident)))
        training = self.model.training  # load_adapter leaves the model in eval mode
        device = str(next(self.model.parameters()).device)
        self.model.load_adapter(str(directory), adapter_name=name, torch_device=device)
        self.model.train(training)
        self.resident[name] = None

    def unload(self, name: str) -> None:
        """Free the adapter `name`'s weights, if resident."""
        if self.resident.pop(name, False) is not False:
            self.model.delete_adapter(name)


@dataclass(frozen=True)
class PooledAdapter:
    """The adapter `name`, saved in `directory`, served by `pool`."""

    pool: AdapterPool
    name: str
    directory: Path

    def selected(self):
        return self.pool.selected(self.name, self.directory)


def merged_adapter_weights(base: str | Path, adapter: Path) -> dict[str, torch.Tensor]:
    """The weights of the model at `base` with the peft adapter saved in `adapter` merged in, in
    float32 under the base model's names (a tied output layer left to the embedding's name): what
    `PolicyBackend.load_state` takes."""
    from peft import PeftModel

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    state = merged.state_dict()
    if getattr(merged.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    return state


class HFBackend(PolicyBackend):
    """Batched sampling with `model.generate`; prompts are sorted by length and left-padded.

    Given `model` (a learner's own, in memory), the backend generates with it instead of a
    copy: its weights are always the learner's current ones, so loading weights only records
    the version. A league's LoRA exploiters generate this way, at the cost of no extra weights.

    A `frozen` backend (a league snapshot, whose weights change only when it loads others)
    meets the same game states step after step: under legal decoding it keeps the model's final
    hidden state after each context it has run, and runs only contexts it has not seen.

    With `adapter`, the backend serves that LoRA adapter over `model`, the peft model its pool
    holds adapters in (a league snapshot of a LoRA learner, over the learner's own model).
    """

    def __init__(
        self,
        model_path: str,
        *,
        device: str | None = None,
        dtype: torch.dtype = torch.float32,
        max_batch_size: int = 256,
        model: torch.nn.Module | None = None,
        frozen: bool = False,
        adapter: PooledAdapter | None = None,
    ):
        self.model_path = model_path
        self.device = pick_device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.shares_model = model is not None
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(self.device).eval()
        self.model = model
        self.eos_ids = stop_ids(self.tokenizer, self.model.generation_config)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos_ids)
        self.max_batch_size = max_batch_size
        self.version = 0
        self.states: OrderedDict[bytes, torch.Tensor] | None = OrderedDict() if frozen else None
        self.adapter = adapter

    @contextlib.contextmanager
    def serving(self) -> Iterator[torch.nn.Module]:
        """The model as this backend generates with it (its adapter selected), in eval mode and
        without gradients while the block runs: what probes of the policy read. A learner's
        model goes back to training mode after."""
        training = self.model.training
        self.model.eval()
        try:
            with self.adapter.selected() if self.adapter is not None else contextlib.nullcontext(), torch.no_grad():
                yield self.model
        finally:
            self.model.train(training)

    @functools.cached_property
    def grammars(self) -> Grammars:
        """Structured decoding's grammars, compiled for this model's tokenizer and vocabulary."""
        return Grammars(self.tokenizer, vocab_size(self.model), self.eos_ids)

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingSettings,
        choices: list[Choices] | None = None,
        grammars: list[str] | None = None,
    ) -> list[Generation]:
        results: list[Generation | None] = [None] * len(prompts)
        # Sampling draws from torch's global generator; fork it so a seed here never
        # disturbs (or is disturbed by) the caller's random state.
        devices = [self.device] if self.device.startswith("cuda") else []
        with self.serving(), torch.random.fork_rng(devices=devices):
            torch.manual_seed(sampling.seed)
            # Free and structured sampling run a shared prefix once; legal decoding runs whole contexts.
            if choices is None:
                chunks = prefix_batches(prompts, self.max_batch_size)
            else:
                chunks = length_batches(range(len(prompts)), prompts, self.max_batch_size)
            for chunk in chunks:
                batch = [prompts[i] for i in chunk]
                if choices is None:
                    row_grammars = None if grammars is None else [grammars[i] for i in chunk]
                    generations = self._generate_batch(batch, sampling, row_grammars)
                else:
                    generations = self._generate_legal(batch, [choices[i] for i in chunk], sampling)
                for i, generation in zip(chunk, generations):
                    results[i] = generation
        return results

    def _generate_batch(
        self, prompts: list[list[int]], sampling: SamplingSettings, grammars: list[str] | None = None
    ) -> list[Generation]:
        """Sampling by `model.generate`; with `grammars` (structured decoding), each row's logits
        masked to its grammar before the temperature and top-p, as vLLM masks them."""
        # The prompts' common prefix (a game's rules, most of each prompt) runs once; its keys
        # and values are repeated across the batch, and each row's rest follows it, left-padded
        # after the prefix (masked out, positions counted over real tokens only).
        shared = common_prefix_length(prompts) if len(prompts) > 1 else 0
        cache = None
        if shared:
            cache = self.model(input_ids=torch.tensor([prompts[0][:shared]], device=self.device)).past_key_values
            cache.batch_repeat_interleave(len(prompts))
        width = max(len(p) for p in prompts) - shared
        input_ids = torch.full((len(prompts), shared + width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), shared + width), dtype=torch.long)
        input_ids[:, :shared] = torch.tensor(prompts[0][:shared], dtype=torch.long)
        attention_mask[:, :shared] = 1
        for row, prompt in enumerate(prompts):
            rest = prompt[shared:]
            input_ids[row, shared + width - len(rest) :] = torch.tensor(rest, dtype=torch.long)
            attention_mask[row, shared + width - len(rest) :] = 1
        width += shared
        greedy = sampling.temperature == 0
        out = self.model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=attention_mask.to(self.device),
            past_key_values=cache,
            max_new_tokens=sampling.max_new_tokens,
            do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else sampling.top_p,
            top_k=None,
            eos_token_id=sorted(self.eos_ids),
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_scores=True,
            logits_processor=None if grammars is None else [GrammarLogitsProcessor(self.grammars, grammars)],
        )
        new_tokens = out.sequences[:, width:].cpu()
        # The sampler's log-probability: of the distribution each token was drawn from, the
        # scores after the grammar's mask and the temperature and top-p warpers (masked tokens
        # and those outside the nucleus -inf, so their log-softmax is renormalised over the
        # rest). A drawn token is never outside them; the pad tokens after a row's stop may be,
        # and `cut_at_stop` drops them.
        scores = torch.stack(out.scores, dim=1).float().cpu()
        logprobs = torch.log_softmax(scores, dim=-1).gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        return [
            cut_at_stop(new_tokens[row].tolist(), logprobs[row].tolist(), self.eos_ids, self.tokenizer, self.version)
            for row in range(len(prompts))
        ]

    def _generate_legal(
        self, prompts: list[list[int]], choices: list[Choices], sampling: SamplingSettings
    ) -> list[Generation]:
        """Legal decoding: the model runs once per round for every response waiting on a choice
        between tokens, and the token is drawn from its probabilities over those allowed."""
        greedy = sampling.temperature == 0

        def sample(rows, written, allowed, _round) -> list[tuple[int, float]]:
            # Games in the same state share a context (every Kuhn Poker deal of one card, every
            # TicTacToe opening): each distinct context runs once, and its rows share the logits.
            contexts = [(*prompts[row], *response) for row, response in zip(rows, written)]
            distinct = {context: i for i, context in enumerate(dict.fromkeys(contexts))}
            hidden = self._context_hidden(list(distinct))
            logits = self.model.get_output_embeddings()(hidden).float()[[distinct[c] for c in contexts]]
            if not greedy:
                logits = logits / sampling.temperature
            mask = torch.zeros_like(logits, dtype=torch.bool)
            for i, tokens in enumerate(allowed):
                mask[i, list(tokens)] = True
            logp = masked_log_softmax(logits, mask)
            picked = logp.argmax(-1) if greedy else torch.multinomial(logp.exp(), 1).squeeze(-1)
            return [(int(token), float(logp[i, token])) for i, token in enumerate(picked)]

        responses, logprobs = legal_decode(choices, sample)
        return [
            cut_at_stop(response, logp, self.eos_ids, self.tokenizer, self.version)
            for response, logp in zip(responses, logprobs)
        ]

    def _context_hidden(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        """The model's final hidden state after each context, (contexts, hidden size). A frozen
        backend runs each context it has not kept alone, so that what it keeps is the same
        whichever contexts came with it: a resumed run samples exactly as the unbroken one."""
        # A placeholder response token makes `response_hidden` return the state after the context.
        if self.states is None:
            return response_hidden(self.model, contexts, [[0]] * len(contexts))
        rows = []
        for context in contexts:
            key = hashlib.blake2b(array("q", context).tobytes(), digest_size=16).digest()
            if key in self.states:
                self.states.move_to_end(key)
            else:
                self.states[key] = response_hidden(self.model, [context], [[0]])[0]
                if len(self.states) > FROZEN_STATE_CACHE:
                    self.states.popitem(last=False)
            rows.append(self.states[key])
        return torch.stack(rows)

    def load_state(self, weights: Weights, version: int) -> None:
        """Each tensor is cast to the model's dtype and kept in host memory until the stream is
        whole and checked, then copied into the model's own tensor of that name (a tied output
        layer shares the embedding's)."""
        if self.shares_model:
            for _ in weights:  # read through all the same: its producer may be a collective
                pass
        else:
            staged = [
                (target, tensor.detach().to("cpu", target.dtype))
                for _, tensor, target in checked_weights(self.model, weights)
            ]
            with torch.no_grad():
                for target, tensor in staged:
                    target.copy_(tensor)
        if self.states is not None:
            self.states.clear()
        self.version = version

    def load_weights(self, path: Path, version: int) -> None:
        with safe_open(str(path), framework="pt", device="cpu") as weights:
            self.load_state(((name, weights.get_tensor(name)) for name in weights.keys()), version)
