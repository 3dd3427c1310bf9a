"""Methods that vLLM mixes into its worker processes, for `VLLMBackend` to call through
`LLM.collective_rpc`.

vLLM imports this module inside each worker (it is named to `vllm.LLM` by its dotted path,
`worker_extension_cls="selfplay.backends.vllm_worker.SelfplayWorkerExtension"`), so it must
not import anything heavy at module level. The method names carry a `selfplay_` prefix
because vLLM refuses an extension whose attributes clash with the worker's own.
"""

from __future__ import annotations

from collections.abc import Iterator

LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")


def _safetensors_weights(path: str, aliases: dict[str, list[str]]) -> Iterator[tuple[str, object]]:
    """(name, tensor) for every tensor in the file, in the checkpoint's own naming, then the
    same tensor again under each name tied to it (`aliases`) that the file leaves out."""
    from safetensors import safe_open

    with safe_open(path, framework="pt", device="cpu") as f:
        names = list(f.keys())
        present = set(names)
        extra = []
        for name in names:
            tensor = f.get_tensor(name)
            yield name, tensor
            extra.extend((alias, tensor) for alias in aliases.get(name, ()) if alias not in present)
        # After the rest: vLLM's loader groups weights by their first name component.
        yield from extra


def _tied_parameters(model) -> dict[str, list[str]]:
    """For each parameter name shared with another (tied embeddings), the other names."""
    names_by_param: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names_by_param.setdefault(id(param), []).append(name)
    return {
        name: [other for other in names if other != name]
        for names in names_by_param.values()
        if len(names) > 1
        for name in names
    }


class SelfplayWorkerExtension:
    """Mixed into vLLM's worker class; `self` is the worker, which owns `model_runner`."""

    def selfplay_reload_weights(self, path: str) -> int:
        """Load the safetensors checkpoint at `path` into the running model, in place.

        `model_runner.reload_weights` runs the model's own checkpoint loader (name mapping,
        fused q/k/v and gate/up projections) layer by layer, then the same post-load
        processing as at start-up, so backends that repack weights into a kernel layout
        (the CPU backend does) get repacked weights. Calling `model.load_weights` directly
        skips that step and fails there.

        Tied embeddings need care: a Hugging Face checkpoint stores the shared tensor once
        (`model.embed_tokens.weight`), but the reload processes each layer separately, and a
        layer that receives no tensor keeps its old processed state. On CPU the output
        layer (`lm_head`) keeps a packed copy of the weight for its GEMM, so it would go on
        computing logits with the old embeddings. The shared tensor is therefore fed under
        every name tied to it. Returns how many tensors were fed.
        """
        aliases = _tied_parameters(self.model_runner.get_model())
        count = 0

        def counted() -> Iterator[tuple[str, object]]:
            nonlocal count
            for item in _safetensors_weights(path, aliases):
                count += 1
                yield item

        self.model_runner.reload_weights(weights_iterator=counted())
        return count

    def selfplay_set_logprobs_mode(self, mode: str) -> str:
        """Switch which log-probabilities the sampler reports, for the requests that follow.

        vLLM fixes `logprobs_mode` per engine, but the sampler only reads it at sampling
        time (V1 model runner), so it can change between `generate` calls. Returns the mode
        now in force.
        """
        if mode not in LOGPROBS_MODES:
            raise ValueError(f"unsupported logprobs mode {mode!r}")
        sampler = self.model_runner.sampler
        if not hasattr(sampler, "logprobs_mode"):
            raise RuntimeError(f"{type(sampler).__name__} has no logprobs_mode to switch")
        sampler.logprobs_mode = mode
        inner = getattr(sampler, "topk_topp_sampler", None)
        if inner is not None and hasattr(inner, "logprobs_mode"):
            inner.logprobs_mode = mode
        return sampler.logprobs_mode
