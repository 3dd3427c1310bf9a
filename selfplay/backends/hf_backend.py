"""Generation with Hugging Face transformers, on CPU or GPU: the backend that needs nothing
beyond transformers, and the reference the vLLM backend is checked against."""

from __future__ import annotations

import contextlib
import functools
import hashlib
from array import array
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

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
        self.row_adapters: list[str] = []  # while routed: each row's adapter, or one for every row

    @contextlib.contextmanager
    def selected(self, name: str, directory: Path) -> Iterator[None]:
        """While the block runs, every call of the model computes every row with the adapter
        `name` (saved in `directory`) alone."""
        with self.routed([(name, directory)]), self.rows([name]):
            yield

    @contextlib.contextmanager
    def routed(self, adapters: Iterable[tuple[str, Path]]) -> Iterator[None]:
        """Load `adapters` (name, directory), at most `capacity` of them; while the block runs,
        every LoRA layer of the model computes each row of every call with the adapter
        `row_adapters` names for it (set by `rows`), through peft's mixed-batch path (its
        `adapter_names`): one name a row of the call, or one name for every row of any call,
        which holds whatever runs the model: `generate`, a forward pass, or the decoder alone
        with a prefix run once and then repeated over the batch. A name may be one of the
        model's own adapters."""
        for name, directory in adapters:
            self._load(name, directory)
        with computing_rows_with(self.model, lambda: self.row_adapters):
            yield

    @contextlib.contextmanager
    def rows(self, names: list[str]) -> Iterator[None]:
        """While the block runs, the routed model computes the calls' rows with `names`'s adapters
        (`routed`)."""
        outer, self.row_adapters = self.row_adapters, names
        try:
            yield
        finally:
            self.row_adapters = outer

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


@contextlib.contextmanager
def computing_rows_with(model: torch.nn.Module, row_adapters: Callable[[], list[str]]) -> Iterator[None]:
    """While the block runs, every LoRA layer of the peft `model` computes each row of every call
    with the adapter `row_adapters()` names for it as the call runs, through peft's mixed-batch
    path (its `adapter_names`): one name a row of the call, or one name for every row of any
    call. Rows all of the model's active adapter take peft's plain path: the same sums, without
    the mixed path's copy of every row."""
    from peft.tuners.lora import LoraLayer

    own = model.active_adapter

    def rows_with_adapters(_module, args, kwargs):
        names = row_adapters()
        if names == [own]:
            return args, kwargs
        rows = len(args[0] if args else kwargs["x"])
        return args, {**kwargs, "adapter_names": names * rows if len(names) == 1 else names}

    handles = [
        layer.register_forward_pre_hook(rows_with_adapters, with_kwargs=True)
        for layer in model.modules()
        if isinstance(layer, LoraLayer)
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@dataclass(frozen=True)
class PooledAdapter:
    """The adapter `name`, saved in `directory`, served by `pool`."""

    pool: AdapterPool
    name: str
    directory: Path


def resident_groups(adapters: list[PooledAdapter | None]) -> list[list[int]]:
    """The indices of `adapters` in groups whose adapters their pool holds at once, in order: one
    group when it holds them all. Rows without an adapter (the model's own) join the first."""
    distinct = list(dict.fromkeys(adapter for adapter in adapters if adapter is not None))
    if not distinct:
        return [list(range(len(adapters)))]
    capacity = distinct[0].pool.capacity
    parts = [set(distinct[start : start + capacity]) for start in range(0, len(distinct), capacity)]
    groups = [[i for i, adapter in enumerate(adapters) if adapter in part] for part in parts]
    groups[0] = sorted(groups[0] + [i for i, adapter in enumerate(adapters) if adapter is None])
    return groups


@dataclass(frozen=True)
class _RowPolicies:
    """The policy of each row of a batch over one model, and the adapter each row computes with
    there: its pooled adapter's name, or the model's active adapter; None for every row where
    no row has a pooled adapter (`pool` None: the model computes as it is)."""

    policies: list[HFBackend]
    pool: AdapterPool | None
    model: torch.nn.Module

    @functools.cached_property
    def adapters(self) -> list[str | None]:
        if self.pool is None:
            return [None] * len(self.policies)
        own = self.model.active_adapter
        return [own if policy.adapter is None else policy.adapter.name for policy in self.policies]

    @property
    def versions(self) -> list[int]:
        return [policy.version for policy in self.policies]

    def subset(self, rows: list[int]) -> _RowPolicies:
        return _RowPolicies([self.policies[row] for row in rows], self.pool, self.model)

    def routed(self, adapters: list[str | None]):
        """A context in which the model computes each row of its calls with `adapters`'s adapter,
        or every row with the one adapter they all name."""
        if self.pool is None:
            return contextlib.nullcontext()
        return self.pool.rows(adapters[:1] if len(set(adapters)) == 1 else adapters)


def _picked(indices: list[int], values: list | None) -> list | None:
    """`values` at `indices`, in order; None for None."""
    return None if values is None else [values[i] for i in indices]


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
        tokenizer: PreTrainedTokenizerBase | None = None,
    ):
        self.model_path = model_path
        self.device = pick_device(device)
        # Backends of one model may share a tokenizer (a league's past players: SmolLM2's holds 10 MiB).
        self.tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(model_path)
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

    @property
    def engine_key(self) -> torch.nn.Module:
        """The model: backends over one model (a LoRA learner's, and the adapter snapshots pooled
        over it) generate each other's prompts in one call (`generate_rows`)."""
        return self.model

    @contextlib.contextmanager
    def serving(self) -> Iterator[torch.nn.Module]:
        """The model as this backend generates with it (its adapter selected), in eval mode and
        without gradients while the block runs: what probes of the policy read. A learner's
        model goes back to training mode after."""
        with self._serving([self]) as pool, pool.rows([self.adapter.name]) if pool else contextlib.nullcontext():
            yield self.model

    @contextlib.contextmanager
    def _serving(self, policies: list[HFBackend]) -> Iterator[AdapterPool | None]:
        """The model in eval mode and without gradients while the block runs, with the adapters
        of `policies` (backends over it) loaded: yields their pool, which routes each call's rows
        to their adapters (`AdapterPool.rows`), or None where none has one (every row the model's
        own adapters). A learner's model goes back to training mode after."""
        adapters = [policy.adapter for policy in policies if policy.adapter is not None]
        pool = adapters[0].pool if adapters else None
        training = self.model.training
        self.model.eval()
        try:
            routed = pool.routed((a.name, a.directory) for a in adapters) if pool else contextlib.nullcontext()
            with routed, torch.no_grad():
                yield pool
        finally:
            self.model.train(training)

    @functools.cached_property
    def grammars(self) -> Grammars:
        """Structured decoding's grammars, compiled for this model's tokenizer and vocabulary."""
        return Grammars(self.tokenizer, vocab_size(self.model), self.eos_ids)

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingSettings,
        choices: list[Choices] | None = None,
        grammars: list[str] | None = None,
    ) -> list[Generation]:
        return self._generate_rows([self] * len(prompts), prompts, sampling, choices, grammars)

    def generate_rows(
        self,
        policies: list[PolicyBackend],
        prompts: list[list[int]],
        sampling: SamplingSettings,
        choices: list[Choices] | None = None,
        grammars: list[str] | None = None,
    ) -> Iterator[list[tuple[int, Generation]]]:
        """Every prompt in one batch over the model, each row with its policy's adapter (peft's
        mixed batch), as one group; in a batch per group of adapters the pool holds at once
        where it holds fewer than the rows ask for."""
        yield list(enumerate(self._generate_rows(policies, prompts, sampling, choices, grammars)))

    def _generate_rows(
        self,
        policies: list[HFBackend],
        prompts: list[list[int]],
        sampling: SamplingSettings,
        choices: list[Choices] | None,
        grammars: list[str] | None,
    ) -> list[Generation]:
        results: list[Generation | None] = [None] * len(prompts)
        # Sampling draws from torch's global generator; fork it so a seed here never
        # disturbs (or is disturbed by) the caller's random state.
        devices = [self.device] if self.device.startswith("cuda") else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(sampling.seed)
            for group in resident_groups([policy.adapter for policy in policies]):
                with self._serving([policies[i] for i in group]) as pool:
                    rows = _RowPolicies([policies[i] for i in group], pool, self.model)
                    pick = functools.partial(_picked, group)
                    generations = self._generate_group(rows, pick(prompts), sampling, pick(choices), pick(grammars))
                for i, generation in zip(group, generations):
                    results[i] = generation
        return results

    def _generate_group(
        self,
        rows: _RowPolicies,
        prompts: list[list[int]],
        sampling: SamplingSettings,
        choices: list[Choices] | None,
        grammars: list[str] | None,
    ) -> list[Generation]:
        """The prompts of rows whose adapters are all loaded, in batches of at most max_batch_size."""
        results: list[Generation | None] = [None] * len(prompts)
        # Free and structured sampling run a shared prefix once; legal decoding runs whole contexts.
        if choices is None:
            chunks = prefix_batches(prompts, self.max_batch_size)
        else:
            chunks = length_batches(range(len(prompts)), prompts, self.max_batch_size)
        for chunk in chunks:
            pick = functools.partial(_picked, chunk)
            if choices is None:
                generations = self._generate_batch(pick(prompts), sampling, rows.subset(chunk), pick(grammars))
            else:
                generations = self._generate_legal(pick(prompts), pick(choices), sampling, rows.subset(chunk))
            for i, generation in zip(chunk, generations):
                results[i] = generation
        return results

    def _generate_batch(
        self,
        prompts: list[list[int]],
        sampling: SamplingSettings,
        rows: _RowPolicies,
        grammars: list[str] | None = None,
    ) -> list[Generation]:
        """Sampling by `model.generate`, each row with its policy's adapter; with `grammars`
        (structured decoding), each row's logits masked to its grammar before the temperature
        and top-p, as vLLM masks them."""
        # The prompts' common prefix (a game's rules, most of each prompt) runs once for each
        # adapter of the rows; its keys and values go to the rows of that adapter, and each
        # row's rest follows it, left-padded after the prefix (masked out, positions counted
        # over real tokens only).
        shared = common_prefix_length(prompts) if len(prompts) > 1 else 0
        cache = None
        if shared:
            adapters = list(dict.fromkeys(rows.adapters))
            with rows.routed(adapters):
                cache = self.model(input_ids=torch.tensor([prompts[0][:shared]] * len(adapters), device=self.device))
            cache = cache.past_key_values
            cache.batch_select_indices(torch.tensor([adapters.index(a) for a in rows.adapters], device=self.device))
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
        with rows.routed(rows.adapters):
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
            cut_at_stop(new_tokens[row].tolist(), logprobs[row].tolist(), self.eos_ids, self.tokenizer, version)
            for row, version in enumerate(rows.versions)
        ]

    def _generate_legal(
        self, prompts: list[list[int]], choices: list[Choices], sampling: SamplingSettings, rows: _RowPolicies
    ) -> list[Generation]:
        """Legal decoding: each round, every response waiting on a choice between tokens gets
        its policy's final hidden state (each policy's contexts run together, with its adapter),
        and the token is drawn from its probabilities over those allowed, all rows at once."""
        greedy = sampling.temperature == 0

        def sample(indices, written, allowed, _round) -> list[tuple[int, float]]:
            contexts = [(*prompts[row], *response) for row, response in zip(indices, written)]
            logits = torch.empty((len(indices), vocab_size(self.model)), device=self.device)
            by_policy: dict[int, list[int]] = defaultdict(list)  # each policy's rows: its own cached states
            for i, row in enumerate(indices):
                by_policy[id(rows.policies[row])].append(i)
            for members in by_policy.values():
                row = indices[members[0]]
                with rows.routed([rows.adapters[row]]):
                    logits[members] = rows.policies[row]._context_logits([contexts[i] for i in members])
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
            cut_at_stop(response, logp, self.eos_ids, self.tokenizer, version)
            for response, logp, version in zip(responses, logprobs, rows.versions)
        ]

    def _context_logits(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        """The model's next-token logits after each context, (contexts, vocabulary) in float32:
        games in the same state share a context (every Kuhn Poker deal of one card, every
        TicTacToe opening), and each distinct context runs once."""
        distinct = {context: i for i, context in enumerate(dict.fromkeys(contexts))}
        hidden = self._context_hidden(list(distinct))
        return self.model.get_output_embeddings()(hidden).float()[[distinct[c] for c in contexts]]

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
