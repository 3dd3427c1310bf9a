"""Methods that vLLM mixes into its worker processes, for `VLLMBackend` to call through
`LLM.collective_rpc`.

vLLM imports this module inside each worker (it is named to `vllm.LLM` by its dotted path,
`worker_extension_cls="selfplay.backends.vllm_worker.SelfplayWorkerExtension"`), so it must
not import anything heavy at module level. The method names carry a `selfplay_` prefix
because vLLM refuses an extension whose attributes clash with the worker's own.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator


def _file_weights(path: str) -> Iterator[tuple[str, object]]:
    """(name, tensor) for every tensor in the safetensors file, in the checkpoint's own naming."""
    from safetensors import safe_open

    with safe_open(path, framework="pt", device="cpu") as f:
        for name in f.keys():
            yield name, f.get_tensor(name)


def _with_tied_aliases(weights: Iterable[tuple[str, object]], aliases: dict[str, list[str]]):
    """`weights`, then each tensor again under each name tied to it (`aliases`) that the
    weights left out."""
    given, tied = set(), []
    for name, tensor in weights:
        given.add(name)
        tied.extend((alias, tensor) for alias in aliases.get(name, ()))
        yield name, tensor
    # After the rest: vLLM's loader groups weights by their first name component.
    yield from ((alias, tensor) for alias, tensor in tied if alias not in given)


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
        """Load the safetensors checkpoint at `path` into the running model, in place; returns
        how many tensors were fed (see `_selfplay_reload`)."""
        return self._selfplay_reload(_file_weights(path))

    def selfplay_stage_weights(self, layout: list, data: bytes) -> int:
        """Keep the next piece of a packed weights stream (`selfplay.backends.base.packed`) for
        `selfplay_load_staged_weights`: `layout`, the next tensors' names, dtypes and shapes
        (empty when an earlier piece gave them), and `data`, the stream's next bytes. Returns
        how many bytes wait.

        The stream waits whole rather than being reloaded piece by piece: a reload processes
        each layer once all its tensors have come, and a layer that gets only some of them in
        one reload (a fused q/k/v projection split between two pieces) is left with memory
        that was never written."""
        staged_layout, staged_data = self.__dict__.setdefault("_selfplay_staged", ([], bytearray()))
        staged_layout.extend((name, dtype, tuple(shape)) for name, dtype, shape in layout)
        staged_data += data
        return len(staged_data)

    def selfplay_load_staged_weights(self) -> int:
        """Load the staged stream into the running model, in place; returns how many tensors
        were fed."""
        import torch

        from selfplay.backends.base import unpacked

        layout, data = self.__dict__.pop("_selfplay_staged", ([], bytearray()))
        return self._selfplay_reload(unpacked(layout, torch.frombuffer(data, dtype=torch.uint8)))

    def selfplay_drop_staged_weights(self) -> None:
        """Forget a stream that will not be loaded (it broke off, or was refused)."""
        self.__dict__.pop("_selfplay_staged", None)

    def _selfplay_reload(self, weights: Iterable[tuple[str, object]]) -> int:
        """Reload the running model from `weights` (the checkpoint's naming), in place.

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
            for item in _with_tied_aliases(weights, aliases):
                count += 1
                yield item

        self.model_runner.reload_weights(weights_iterator=counted())
        return count
