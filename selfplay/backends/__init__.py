"""Policy backends: batched generation and in-place weight updates (transformers, vLLM)."""

from selfplay.backends.base import Generation, PolicyBackend, SamplingSettings, save_weights

BACKENDS = ("hf", "vllm")


def make_backend(kind: str, model_path: str, **options) -> PolicyBackend:
    """A backend of `kind` ("hf" or "vllm") serving the model at `model_path`."""
    if kind == "hf":
        from selfplay.backends.hf_backend import HFBackend

        return HFBackend(model_path, **options)
    if kind == "vllm":
        from selfplay.backends.vllm_backend import VLLMBackend

        return VLLMBackend(model_path, **options)
    from selfplay.errors import UserError

    raise UserError(f"Unknown backend '{kind}'; choose one of {', '.join(BACKENDS)}.")


__all__ = ["BACKENDS", "Generation", "PolicyBackend", "SamplingSettings", "make_backend", "save_weights"]
