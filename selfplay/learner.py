"""The learner: one shared policy, trained on the turns of every role it played (or, with
`learner.adapter_per_role`, one LoRA adapter per role over one base: `RoleLearners`).

Each update takes `Sample`s (a turn's prompt and response ids, the sampler's log-probs and the
turn's advantage) and runs a policy-gradient loss over the response tokens:

- `ppo`: the clipped surrogate, with ratios against the learner's own log-probs before the
  update; `reinforce`: advantage times log-probability.
- Truncated importance sampling corrects for the sampler (vLLM kernels, or a stale version)
  differing from the learner: each token's loss is weighted by
  min(exp(learner_logprob - sampler_logprob), importance_clip), as TRL and verl do.
- Optional KL penalty towards the frozen initial policy (k3 estimator, per token).
- Optional entropy bonus (the entropy of each response position's next-token distribution):
  with self-play it keeps the policy from collapsing onto one move before its opponents have
  answered it, and its fixed points are the smoothed (quantal response) equilibria.
- Token aggregation: `token_mean` over all tokens of a minibatch, `seq_mean_token_mean`
  (mean per response, then over responses), or `token_sum` over a fixed length (Dr.GRPO).

Minibatches are split into micro-batches by token count and gradients accumulate across them,
so memory is bounded whatever the number of samples. The model scores each distinct (prompt,
response) once, however many samples repeat it; the loss still counts every sample.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import safetensors.torch
import torch
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM, AutoTokenizer

from selfplay import training_state
from selfplay.backends.base import save_weights, stop_ids
from selfplay.backends.hf_backend import computing_rows_with
from selfplay.checkpoint import ADAPTER_DIR, role_adapter_part
from selfplay.config import LearnerConfig
from selfplay.errors import UserError
from selfplay.files import published_directory
from selfplay.legal_decoding import Choices, allowed_mask
from selfplay.reference_cache import ReferenceCache, turn_key
from selfplay.scoring import autocast, pick_device, response_logprobs_and_entropy, vocab_size
from selfplay.sharding import Shards, full_tensors, local_bytes, save_streamed, shard_model
from selfplay.structured_decoding import Grammars

# The name of a LoRA learner's own adapter in its peft model (peft's default): the one it trains,
# saves and merges. Other adapters may sit beside it (league snapshots served over its base).
TRAINED_ADAPTER = "default"
# A LoRA learner's moving KL reference, a frozen adapter beside its own (`learner.reference_update_every`).
REFERENCE_ADAPTER = "reference"


class NonFiniteUpdate(RuntimeError):
    """An update whose loss, gradient or resulting weights are not finite numbers: the policy
    diverged, which no setting refused up front."""


@dataclass(frozen=True)
class Sample:
    """One turn to learn from."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    sampler_logprobs: tuple[float, ...]
    advantage: float
    choices: Choices = ()  # the legal answers' ids when legal decoding sampled it (`selfplay.legal_decoding`)
    grammar: str = ""  # the answer's grammar when structured decoding sampled it (`selfplay.structured_decoding`)
    lag: int = 0  # policy versions between the sampler and the learner (asynchronous rollouts)
    role: str = ""  # the role the turn was played in: which adapter learns from it, with one per role


class Learner:
    def __init__(
        self,
        model_path: str,
        config: LearnerConfig,
        *,
        temperature: float = 1.0,
        token_sum_length: int = 64,
        device: str | None = None,
        seed: int = 0,
        resume_from: str | Path | None = None,
        shared_base: torch.nn.Module | None = None,
        shards: Shards | None = None,
    ):
        """`model_path` is the initial policy (and the KL reference); `resume_from` a model
        directory written by `save_pretrained` to continue from. With LoRA, `shared_base` is the
        initial model already in memory: the learner's adapters sit on its frozen weights
        without copying them, so several learners (a league's exploiters) share one base.
        `shards`: this process's place in a sharded learner's group (`LearnerGroup` starts the
        group and makes every process run each call); None is a learner of one process."""
        self.config = config
        self.temperature = temperature if temperature > 0 else 1.0
        self.token_sum_length = config.token_sum_length or token_sum_length
        self.shards = shards
        self.device = shards.device if shards is not None else pick_device(device)
        torch.manual_seed(seed)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.lora = config.lora.rank > 0
        weights = resume_from if resume_from is not None and not self.lora else model_path
        if shared_base is not None and self.lora:
            model = _sharing_weights(shared_base)
        else:
            model = self._placed(AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32))
        self.tied_embeddings = bool(getattr(model.config, "tie_word_embeddings", False))
        if self.lora:
            model = _with_lora(model, config, Path(resume_from) / ADAPTER_DIR if resume_from is not None else None)
        if config.activation_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model = _without_dropout(model)
        self.model.train()  # for activation checkpointing, which transformers runs in train mode only
        # The KL reference, loaded only when the penalty needs it: without LoRA a frozen copy of
        # the model; with LoRA the base model with adapters switched off, or, where the reference
        # moves, a frozen adapter beside the trained one, which starts as the initial policy.
        self.reference = None
        self.reference_adapter = self.lora and config.kl_coef > 0 and config.reference_update_every > 0
        self.reference_moved = False  # True once the reference is no longer the initial policy
        if config.kl_coef > 0 and not self.lora:
            self.reference = self._placed(AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32))
            self.reference.eval().requires_grad_(False)
        if self.reference_adapter:
            _add_reference_adapter(self.model)
        self.reference_cache = ReferenceCache()
        self.kl_coef = config.kl_coef  # this step's, under `kl_schedule`
        self.kept: dict[str, torch.Tensor] | None = None  # `keep_weights`' copy of the trained weights
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=config.weight_decay)

    # -- the update ----------------------------------------------------------------------------

    def update(self, samples: Sequence[Sample], lr: float | None = None) -> dict[str, float]:
        """One learning step on `samples`: `epochs` passes of `minibatches` optimizer steps, at
        learning rate `lr` (`config.lr` if None; see `scheduled_lr`). Returns the statistics
        TensorBoard shows (means over all tokens of the step)."""
        samples = [s for s in samples if s.response_ids]
        if not samples:
            return {}
        config = self.config
        for group in self.optimizer.param_groups:
            group["lr"] = config.lr if lr is None else lr
        reused = config.epochs * config.minibatches > 1
        # PPO needs the pre-update log-probs only when samples are seen after a first step.
        old = self._logprobs(samples, grad=False) if reused else None
        reference = self._reference_logprobs(samples) if config.kl_coef > 0 else None
        steps = []
        for _ in range(config.epochs):
            order = torch.randperm(len(samples)).tolist()
            if self.shards is not None:  # every process splits the same minibatches
                order = self.shards.from_first(order)
            for part in range(min(config.minibatches, len(samples))):
                steps.append(self._minibatch_step(samples, order[part :: config.minibatches], old, reference))
        names = dict.fromkeys(name for step in steps for name in step)  # a lag may be missing from a minibatch
        stats = {}
        for name in names:
            values = [step[name] for step in steps if name in step]
            stats[name] = sum(values) / len(values)
        stats["ratio_max"] = max(step["ratio_max"] for step in steps)
        stats["tokens"] = sum(len(s.response_ids) for s in samples)
        stats["lr"] = self.optimizer.param_groups[0]["lr"]
        return stats

    def scheduled_update(self, samples: Sequence[Sample], step: int, total_steps: int) -> dict[str, float]:
        """Update `step` (counted from 1) of a run of `total_steps`: `update` at the learning rate
        the schedule gives that step (`scheduled_lr`) and KL penalty `scheduled_kl`, then the KL
        reference moves towards the new policy if `reference_update_every` says it is due."""
        self.kl_coef = scheduled_kl(self.config, step, total_steps)
        stats = self.update(samples, scheduled_lr(self.config, step, total_steps))
        if self.config.kl_schedule != "constant":
            stats["kl_coef"] = self.kl_coef
        every = self.config.reference_update_every
        if every and step % every == 0:
            self.move_reference()
        return stats

    def _minibatch_step(self, samples, indices, old, reference) -> dict[str, float]:
        config = self.config
        lengths = [len(samples[i].response_ids) for i in indices]
        if config.aggregation == "token_mean":
            weights = [1.0 / sum(lengths)] * len(indices)
        elif config.aggregation == "seq_mean_token_mean":
            weights = [1.0 / (n * len(indices)) for n in lengths]
        else:  # token_sum over a fixed length
            weights = [1.0 / (self.token_sum_length * len(indices))] * len(indices)
        weight_of = dict(zip(indices, weights))
        copies = _copies(samples, indices)
        sums = dict.fromkeys(("loss", "clip_fraction", "kl", "entropy", "ratio", "ratio_clipped"), 0.0)
        ratio_max = 0.0
        tokens = 0
        lag_sums: dict[int, float] = {}  # the ratio to the sampler summed over the tokens of each lag
        lag_tokens: dict[int, int] = {}
        self.optimizer.zero_grad(set_to_none=True)
        for chunk, counts in self._share(list(_micro_batches(list(copies), samples, config.micro_batch_tokens))):
            batch = [samples[i] for i in chunk]
            with self._autocast():
                logprobs, entropies = self._score(self.model, batch)
            if not counts:  # padding, so that every process of a sharded learner runs as many passes
                (torch.cat(logprobs).sum() * 0.0).backward()
                continue
            # Every copy of a sequence reads the log-probs computed once for it; from here on all
            # is per token of the chunk's samples, copies included, as if each had run alone.
            members, at, start = [], [], 0
            for first, logp in zip(chunk, logprobs):
                members += copies[first]
                at += list(range(start, start + len(logp))) * len(copies[first])
                start += len(logp)
            # index_select: its backward adds the copies' gradients in order (see `response_hidden`).
            at = torch.tensor(at, device=logprobs[0].device)
            logp = torch.cat(logprobs).float().index_select(0, at)
            entropy = torch.cat(entropies).float().index_select(0, at)
            lengths = torch.tensor([len(samples[i].response_ids) for i in members], device=logp.device)
            per_sample = [[samples[i].advantage for i in members], [weight_of[i] for i in members]]
            advantage, weight = torch.tensor(per_sample, device=logp.device).repeat_interleave(lengths, dim=1)
            sampler = torch.tensor([lp for i in members for lp in samples[i].sampler_logprobs], device=logp.device)
            before = torch.cat([old[i] for i in members]) if old is not None else logp.detach()
            ratio_to_sampler = torch.exp(before - sampler)
            importance = (
                ratio_to_sampler.clamp(max=config.importance_clip)
                if config.importance_clip is not None
                else ratio_to_sampler
            )
            if config.loss == "ppo":
                ratio = torch.exp(logp - before)
                clipped = ratio.clamp(1 - config.clip, 1 + config.clip)
                surrogate = torch.minimum(ratio * advantage, clipped * advantage)
                sums["clip_fraction"] += ((ratio - clipped).abs() > 1e-6).sum().item()
            else:
                surrogate = logp * advantage
            token_loss = -importance * surrogate - config.entropy_coef * entropy
            sums["entropy"] += entropy.detach().sum().item()
            if reference is not None:
                log_ratio = torch.cat([reference[i] for i in members]) - logp
                kl = torch.exp(log_ratio) - log_ratio - 1
                token_loss = token_loss + self.kl_coef * kl
                sums["kl"] += kl.detach().sum().item()
            loss = (weight * token_loss).sum()
            loss.backward()
            sums["loss"] += loss.item()
            sums["ratio"] += ratio_to_sampler.sum().item()
            lags = torch.tensor([samples[i].lag for i in members], device=logp.device).repeat_interleave(lengths)
            for lag in lags.unique().tolist():
                at_lag = ratio_to_sampler[lags == lag]
                lag_sums[lag] = lag_sums.get(lag, 0.0) + at_lag.sum().item()
                lag_tokens[lag] = lag_tokens.get(lag, 0) + len(at_lag)
            ratio_max = max(ratio_max, ratio_to_sampler.max().item())
            if config.importance_clip is not None:
                sums["ratio_clipped"] += (ratio_to_sampler > config.importance_clip).sum().item()
            tokens += len(logp)
        if self.shards is not None:  # the whole minibatch's figures, as one process would have them
            *totals, tokens = self.shards.sum([*sums.values(), tokens])
            sums = dict(zip(sums, totals))
            ratio_max = self.shards.max(ratio_max)
            lag_sums, lag_tokens = _merged_counts(self.shards.gather((lag_sums, lag_tokens)))
        trainable = self.optimizer.param_groups[0]["params"]
        grad_norm = torch.nn.utils.clip_grad_norm_(trainable, config.max_grad_norm)
        if isinstance(grad_norm, DTensor):
            grad_norm = grad_norm.full_tensor()
        if not torch.isfinite(grad_norm):  # one such step would make every weight NaN
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteUpdate(
                f"loss {sums['loss']}, gradient norm {grad_norm.item()}: the update was not applied, and the "
                "weights are as they were"
            )
        self.optimizer.step()
        finite = bool(torch.stack([_local(p).isfinite().all() for p in trainable]).all())
        if self.shards is not None:
            finite = self.shards.sum([float(not finite)])[0] == 0
        if not finite:
            broken = [name for name, p in self.model.named_parameters() if not _local(p).isfinite().all()]
            raise NonFiniteUpdate(
                f"loss {sums['loss']}, gradient norm {grad_norm.item()}, and the update made {len(broken)} weight "
                f"tensors infinite or NaN ({', '.join(broken[:3])}{', ...' if len(broken) > 3 else ''}): the "
                "learner's weights are lost"
            )
        loss = sums.pop("loss")
        stats = {name: value / tokens for name, value in sums.items()}
        stats.update(loss=loss, ratio_max=ratio_max, grad_norm=float(grad_norm))
        if set(lag_tokens) != {0}:  # samples from older policy versions: the ratio by how old
            stats.update({f"ratio_lag{lag}": lag_sums[lag] / lag_tokens[lag] for lag in lag_tokens})
        return stats

    def _logprobs(self, samples: Sequence[Sample], grad: bool, model=None) -> list[torch.Tensor]:
        model = model or self.model
        scored: dict[int, torch.Tensor] = {}  # the first copy of each sequence: its log-probs
        copies = _copies(samples, range(len(samples)))
        chunks = list(_micro_batches(list(copies), samples, self.config.micro_batch_tokens))
        with torch.set_grad_enabled(grad), self._autocast():
            for chunk, counts in self._share(chunks):
                logprobs, _ = self._score(model, [samples[i] for i in chunk], entropy=False)
                if counts:
                    scored.update((first, logp.float()) for first, logp in zip(chunk, logprobs))
        if self.shards is not None:  # each process scored its share: every process gets them all
            scored = {first: logp for part in self.shards.gather(scored) for first, logp in part.items()}
        first_of = {i: first for first, same in copies.items() for i in same}
        return [scored[first_of[i]] for i in range(len(samples))]

    def _score(self, model, batch: Sequence[Sample], entropy: bool = True):
        """Log-probs (and entropies) of `batch`'s responses under `model`, under the masks their
        sampler decoded with; a sharded model scores through its registered forward method
        (`selfplay.sharding`)."""
        arguments = [s.prompt_ids for s in batch], [s.response_ids for s in batch], self.temperature
        mask = self._decoding_mask(batch)
        if self.shards is not None:
            return model.score_responses(*arguments, mask, entropy=entropy)
        return response_logprobs_and_entropy(model, *arguments, mask, entropy=entropy)

    def _decoding_mask(self, batch: Sequence[Sample]) -> torch.Tensor | None:
        """The tokens the sampler could pick at each response position (legal decoding's choices,
        structured decoding's grammar replayed), or None where every response was sampled freely."""
        responses = [s.response_ids for s in batch]
        mask = None
        if any(s.choices for s in batch):
            mask = allowed_mask(responses, [s.choices for s in batch], vocab_size(self.model))
        if any(s.grammar for s in batch):
            allowed = self.grammars.mask(responses, [s.grammar for s in batch])
            mask = allowed if mask is None else mask & allowed
        return mask

    @functools.cached_property
    def grammars(self) -> Grammars:
        """Structured decoding's grammars for this model's tokenizer and vocabulary, with the stop
        tokens the backends end a response at."""
        return Grammars(self.tokenizer, vocab_size(self.model), stop_ids(self.tokenizer, self.model.generation_config))

    def _share(self, chunks: list[list[int]]) -> list[tuple[list[int], bool]]:
        """The micro-batches this process runs, each with whether its loss counts (see `Shards.share`)."""
        return [(chunk, True) for chunk in chunks] if self.shards is None else self.shards.share(chunks)

    def _reference_logprobs(self, samples: Sequence[Sample]) -> list[torch.Tensor]:
        """The KL reference's log-probabilities of each sample's response: from the cache for
        turns it scored before, by a forward pass for the rest (`selfplay.reference_cache`).
        Every process of a sharded learner holds the same cache, so all score the same turns."""
        keys = [turn_key(s.prompt_ids, s.response_ids, s.choices, s.grammar) for s in samples]
        known = self.reference_cache.found(keys)
        new = {key: sample for key, sample in zip(keys, samples) if key not in known}
        if new:
            # With LoRA the reference is the same model, with its reference adapter or none.
            if self.reference_adapter:
                as_reference = computing_rows_with(self.model, lambda: [REFERENCE_ADAPTER])
            else:
                as_reference = self.model.disable_adapter() if self.lora else contextlib.nullcontext()
            with as_reference:
                scored = dict(zip(new, self._logprobs(list(new.values()), grad=False, model=self.reference)))
            known.update(scored)
            self.reference_cache.add(scored)
        return [known[key].to(self.device) for key in keys]

    def move_reference(self) -> None:
        """Move the KL reference `reference_update_rate` of the way to the current policy, weight
        by weight: all the way makes it the policy (see `LearnerConfig.reference_update_every`).
        With LoRA the reference adapter moves towards the trained one: below a rate of 1 each of
        its two factors moves on its own, so their product, the reference's change to the base,
        differs from that interpolation by the product of the factors' own differences (rate
        times (1 - rate) times (B - B_ref)(A - A_ref)), small while the reference follows closely."""
        rate = self.config.reference_update_rate
        policy = self._policy_weights()
        with torch.no_grad():
            for name, reference in self._reference_weights().items():
                if rate == 1:
                    reference.copy_(policy[name])
                else:
                    reference.lerp_(policy[name], rate)
        self.reference_moved = True
        self.reference_cache.clear()

    def _reference_weights(self) -> dict[str, torch.Tensor]:
        """The reference's weights by name, each tensor once (tied embeddings are one): the
        reference adapter's, or the frozen copy's (its state dict: a sharded model's parameters
        may be unsharded between passes, its state dict's are always its shards)."""
        if self.reference_adapter:
            return _adapter_parameters(self.model, REFERENCE_ADAPTER)
        distinct = {}
        for name, tensor in self.reference.state_dict().items():
            local = _local(tensor)
            distinct.setdefault(local.data_ptr() if local.numel() else name, (name, tensor))
        return dict(distinct.values())

    def _policy_weights(self) -> dict[str, torch.Tensor]:
        """The policy's weights under the names of the reference's that stand for them."""
        if self.reference_adapter:
            own, reference = f".{TRAINED_ADAPTER}.", f".{REFERENCE_ADAPTER}."
            return {
                name.replace(own, reference): p for name, p in _adapter_parameters(self.model, TRAINED_ADAPTER).items()
            }
        return self.model.state_dict()

    def reference_adapter_state(self) -> dict[str, torch.Tensor]:
        """The reference adapter's weights, to save in the training state once moved."""
        return {name: tensor.detach().cpu().contiguous() for name, tensor in self._reference_weights().items()}

    def load_reference_adapter(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore what `reference_adapter_state` saved."""
        weights = self._reference_weights()
        if weights.keys() != tensors.keys():
            raise ValueError("the saved KL reference adapter does not fit this run's LoRA settings")
        with torch.no_grad():
            for name, tensor in tensors.items():
                weights[name].copy_(tensor)
        self.reference_moved = True

    def keep_weights(self) -> None:
        """Keep a copy of the trained weights as they are now (an exploiter's best checked ones,
        `league.exploiter_keep_best`), saved in the training state; `restore_kept_weights` puts
        them back."""
        self.kept = {name: p.detach().clone() for name, p in self.model.named_parameters() if p.requires_grad}

    def restore_kept_weights(self) -> None:
        trained = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, tensor in self.kept.items():
                trained[name].copy_(tensor)

    def held_bytes(self) -> list[dict[str, int]]:
        """What each process of the learner holds between updates: the bytes of its weights,
        gradients and optimizer state (its shards of them, when sharded), and its peak resident
        memory so far; one entry per process, in rank order."""
        import resource

        optimizer_state = [v for state in self.optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
        held = {
            "parameters": local_bytes(self.model.parameters()),
            "gradients": local_bytes(p.grad for p in self.model.parameters()),
            "optimizer": local_bytes(v for v in optimizer_state if v.dim() > 0),  # the moments, not the step counts
            "peak_resident": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }
        return [held] if self.shards is None else self.shards.gather(held)

    def save_training_state(self, directory: Path) -> None:
        """What a resumed run needs beside the policy's weights: the optimizer's state, a moved KL
        reference and the reference's cached log-probabilities (`selfplay.training_state`; every
        process of a sharded learner writes its part)."""
        training_state.save(self, Path(directory))

    def load_training_state(self, directory: Path) -> None:
        """Restore what `save_training_state` wrote, by a learner of this or another process count."""
        training_state.load(self, Path(directory))

    def _autocast(self):
        if self.shards is not None:  # a sharded model computes at its own mixed precision
            return contextlib.nullcontext()
        return autocast(self.config.precision, torch.device(self.device).type)

    def _placed(self, model: torch.nn.Module) -> torch.nn.Module:
        """`model`, loaded on the CPU, on this learner's device: moved whole, or sharded over the group."""
        if self.shards is None:
            return model.to(self.device)
        return shard_model(model, self.shards, self.config.precision, self.config.offload)

    @contextlib.contextmanager
    def scoring_model(self):
        """The policy as a plain causal LM (LoRA merged in), in eval mode and without
        gradients, for probes such as exact exploitability."""
        base = self.model.get_base_model() if self.lora else self.model
        with _merged(self.model) if self.lora else contextlib.nullcontext(), torch.no_grad():
            base.eval()
            try:
                yield base
            finally:
                self.model.train()

    # -- weights out ---------------------------------------------------------------------------

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        """The policy's weights under the base model's own names (LoRA merged in), each tensor
        once: what a backend or `from_pretrained` loads."""
        if not self.lora:
            state = self.model.state_dict()
        else:
            # Base weight plus each adapter's delta, computed aside: merging in place would touch
            # a base that other learners share, and rounding would drift it.
            from peft.tuners.lora import LoraLayer

            base = self.model.get_base_model()
            with torch.no_grad():
                deltas = {
                    f"{name}.weight": module.get_delta_weight(TRAINED_ADAPTER)
                    for name, module in base.named_modules()
                    if isinstance(module, LoraLayer) and TRAINED_ADAPTER in module.lora_A
                }
                state = {}
                for name, tensor in base.state_dict().items():
                    if "lora_" not in name:
                        name = name.replace(".base_layer.", ".")
                        state[name] = tensor + deltas[name] if name in deltas else tensor.detach().clone()
        if self.tied_embeddings:
            state.pop("lm_head.weight", None)
        return state

    def policy_weights(self, dtype: torch.dtype = torch.float32) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) of each of the policy's weights as a backend loads them (see
        `policy_state_dict`), cast to the backend's `dtype` (a bf16 backend then reads half the
        bytes, and casts nothing). A sharded learner gathers one whole tensor at a time, on every
        process at once: the stream must be read to its end."""
        if self.shards is None:
            for name, tensor in self.policy_state_dict().items():
                yield name, tensor.to(dtype)
        else:
            yield from full_tensors(self.model, dtype, skip=self._tied_names())

    def backend_weights(self, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        """`policy_weights` in one mapping."""
        return dict(self.policy_weights(dtype))

    def _tied_names(self) -> frozenset[str]:
        return frozenset({"lm_head.weight"} if self.tied_embeddings else ())

    def export_weights(self, path: Path, dtype: torch.dtype = torch.float32) -> Path:
        """Write the policy's weights for `PolicyBackend.load_weights` (see `backend_weights`)."""
        return save_weights(self.backend_weights(dtype), path)

    def export_adapter(self, directory: Path) -> Path:
        """Write a LoRA learner's trained adapter alone, in peft's format (adapter_config.json and
        adapter_model.safetensors), into the new or empty `directory`, whole or not at all
        (`published_directory`): what its initial model needs to become its policy."""
        with published_directory(directory, "the adapter") as scratch:
            self.model.save_pretrained(scratch, selected_adapters=[TRAINED_ADAPTER])
            (scratch / "README.md").unlink(missing_ok=True)  # peft's model card, a template to fill in
        return Path(directory)

    def save_pretrained(self, directory: Path) -> None:
        """A Hugging Face model directory (safetensors) of the policy, LoRA merged in; with LoRA
        the adapter itself goes to `adapter/` beside it, for resuming."""
        directory = Path(directory)
        if self.shards is not None:  # the group gathers the weights; the first process writes them
            tied = self._tied_names()
            sizes = {name: 4 * t.numel() for name, t in self.model.state_dict().items() if name not in tied}
            writing = self.shards.rank == 0
            save_streamed(self.policy_weights(), sizes, directory if writing else None)
            if not writing:
                return
        directory.mkdir(parents=True, exist_ok=True)
        base = self.model.get_base_model() if self.lora else self.model
        base.config.save_pretrained(directory)
        if base.generation_config is not None:
            base.generation_config.save_pretrained(directory)
        if self.shards is None:
            save_weights(self.policy_state_dict(), directory / "model.safetensors")
        self.tokenizer.save_pretrained(directory)
        if self.lora:
            self.model.save_pretrained(directory / ADAPTER_DIR, selected_adapters=[TRAINED_ADAPTER])


class RoleLearners:
    """One LoRA learner per role (`learner.adapter_per_role`), each over the same frozen base:
    every update trains each role's adapter on its own role's samples, with its own optimizer,
    and a checkpoint holds each apart (`selfplay.checkpoint.role_adapter_part`): the adapter
    alone, which `eval` and `play` merge into the run's initial model (RUN_DIR@ROLE)."""

    lora = True

    def __init__(self, learners: Mapping[str, Learner]):
        self.learners = dict(learners)
        first = next(iter(self.learners.values()))
        self.config, self.device, self.tokenizer = first.config, first.device, first.tokenizer

    def scheduled_update(self, samples: Sequence[Sample], step: int, total_steps: int) -> dict[str, float]:
        """Each role's `Learner.scheduled_update` on its own role's samples; the statistics of
        each under its role's name (`attacker/loss`)."""
        stats = {}
        for role, learner in self.learners.items():
            own = [sample for sample in samples if sample.role == role]
            stats.update({f"{role}/{k}": v for k, v in learner.scheduled_update(own, step, total_steps).items()})
        return stats

    def save_pretrained(self, directory: Path) -> None:
        """Each role's adapter, in its part of the checkpoint at `directory`."""
        for role, learner in self.learners.items():
            learner.export_adapter(role_adapter_part(directory, role) / ADAPTER_DIR)

    def save_training_state(self, directory: Path) -> None:
        for role, learner in self.learners.items():
            learner.save_training_state(role_adapter_part(directory, role))

    def load_training_state(self, directory: Path) -> None:
        for role, learner in self.learners.items():
            learner.load_training_state(role_adapter_part(directory, role))


def scheduled_lr(config: LearnerConfig, step: int, total_steps: int) -> float:
    """The learning rate of update `step` (counted from 1) in a run of `total_steps` updates:
    linear warm-up over `config.warmup_steps`, then `config.lr_schedule` from `config.lr`
    towards 0 (the last update gets lr / decay steps under "linear")."""
    if step <= config.warmup_steps:
        return config.lr * step / config.warmup_steps
    if config.lr_schedule == "constant":
        return config.lr
    done = (step - 1 - config.warmup_steps) / max(1, total_steps - config.warmup_steps)
    factor = 1.0 - done if config.lr_schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * done))
    return config.lr * factor


def scheduled_kl(config: LearnerConfig, step: int, total_steps: int) -> float:
    """The KL penalty's coefficient at update `step` (counted from 1) of `total_steps`: `kl_coef`
    throughout, or falling linearly from it towards 0 (`kl_schedule`)."""
    if config.kl_schedule == "constant":
        return config.kl_coef
    return config.kl_coef * (1.0 - (step - 1) / max(1, total_steps))


def _add_reference_adapter(peft_model) -> None:
    """A frozen adapter beside the trained one, with its settings, as the moving KL reference: a
    new adapter adds nothing to the base (its B factors are zero), so it starts as the initial
    policy. Its random A factors are drawn aside, leaving the run's random numbers as they were."""
    with torch.random.fork_rng(devices=[]):
        peft_model.add_adapter(REFERENCE_ADAPTER, peft_model.peft_config[TRAINED_ADAPTER])
    for parameter in _adapter_parameters(peft_model, REFERENCE_ADAPTER).values():
        parameter.requires_grad_(False)


def _adapter_parameters(peft_model, adapter: str) -> dict[str, torch.nn.Parameter]:
    """The LoRA weights of `adapter` in `peft_model`, by name."""
    marker = f".{adapter}."
    return {name: parameter for name, parameter in peft_model.named_parameters() if marker in name}


def _sharing_weights(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model`'s module tree holding the very same parameter and buffer tensors, so
    that wrapping it in LoRA adapters leaves `model` itself unchanged and costs no weights."""
    shared = {id(tensor): tensor for tensor in [*model.parameters(), *model.buffers()]}
    return copy.deepcopy(model, shared)


def _without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with every dropout off, in train mode too: the sampler draws from the model without
    dropout, and PPO's ratio compares two passes of the learner, which dropout would give
    different masks (ratios far from 1 at learning rate 0). As TRL does, and for the attention
    dropout that transformers' attention modules apply as a plain float."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0
    return model


def _with_lora(model, config: LearnerConfig, adapter_path: str | Path | None):
    """`model` with LoRA adapters as the config sets them, holding the saved adapter weights at
    `adapter_path` if given. A resumed adapter is built exactly as a new one (not from its saved
    config, whose module set may list in another order), so that it saves the same bytes."""
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

    lora = LoraConfig(
        r=config.lora.rank,
        lora_alpha=config.lora.alpha,
        target_modules=list(config.lora.target_modules),
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, lora)
    if adapter_path is not None:
        device = str(next(model.parameters()).device)
        weights = safetensors.torch.load_file(Path(adapter_path) / "adapter_model.safetensors", device=device)
        mismatch = f"The LoRA adapter at {adapter_path} does not fit the LoRA settings of this run"
        try:
            result = set_peft_model_state_dict(peft_model, weights)
        except RuntimeError:  # a tensor of another rank
            raise UserError(f"{mismatch} (its rank differs); resume with the settings it was trained with.") from None
        if result.unexpected_keys or any("lora_" in key for key in result.missing_keys):
            raise UserError(f"{mismatch} (its modules differ); resume with the settings it was trained with.")
    return peft_model


@contextlib.contextmanager
def _merged(peft_model):
    peft_model.merge_adapter()
    try:
        yield
    finally:
        peft_model.unmerge_adapter()


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This process's part of a (sharded) weight."""
    return (tensor.to_local() if isinstance(tensor, DTensor) else tensor).detach()


def _merged_counts(parts: Iterable[tuple[dict[int, float], dict[int, int]]]) -> tuple[dict, dict]:
    """Each process's per-lag ratio sums and token counts, added up."""
    sums: dict[int, float] = {}
    tokens: dict[int, int] = {}
    for part_sums, part_tokens in parts:
        for lag in part_tokens:
            sums[lag] = sums.get(lag, 0.0) + part_sums[lag]
            tokens[lag] = tokens.get(lag, 0) + part_tokens[lag]
    return dict(sorted(sums.items())), dict(sorted(tokens.items()))


def _copies(samples: Sequence[Sample], indices: Iterable[int]) -> dict[int, list[int]]:
    """The samples among `indices` grouped by identical (prompt, response): the first index of
    each sequence, with the indices of all its copies. Self-play repeats sequences often (a
    Kuhn Poker step plays a dozen information states hundreds of times), and the model need
    score each only once."""
    groups: dict[tuple[tuple[int, ...], tuple[int, ...]], list[int]] = {}
    for i in indices:
        groups.setdefault((samples[i].prompt_ids, samples[i].response_ids), []).append(i)
    return {same[0]: same for same in groups.values()}


def _micro_batches(indices: Sequence[int], samples: Sequence[Sample], max_tokens: int) -> Iterator[list[int]]:
    """`indices` in groups whose padded size stays within `max_tokens`, sorted by prompt so
    that each group's prompts share a long prefix (which `response_hidden` runs once)."""
    chunk: list[int] = []
    widest = 0
    for i in sorted(indices, key=lambda i: samples[i].prompt_ids):
        size = len(samples[i].prompt_ids) + len(samples[i].response_ids)
        if chunk and max(widest, size) * (len(chunk) + 1) > max_tokens:
            yield chunk
            chunk, widest = [], 0
        chunk.append(i)
        widest = max(widest, size)
    if chunk:
        yield chunk
