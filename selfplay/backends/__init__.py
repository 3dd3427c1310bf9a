"""Policy backends: batched generation and in-place weight updates (transformers, vLLM)."""

import torch

from selfplay.backends.base import Generation, PolicyBackend, SamplingSettings, save_weights

BACKENDS = ("hf", "vllm")
PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}  # config name -> weight dtype


def make_backend(kind: str, model_path: str, precision: str = "fp32", **options) -> PolicyBackend:
    """A backend of `kind` ("hf" or "vllm") serving the model at `model_path`, its weights held
    at `precision` ("fp32" or "bf16"; weight updates are cast to it)."""
    dtype = PRECISIONS[precision]
    if kind == "hf":
        from selfplay.backends.hf_backend import HFBackend

        return HFBackend(model_path, dtype=dtype, **options)
    if kind == "vllm":
        from selfplay.backends.vllm_backend import VLLMBackend

        return VLLMBackend(model_path, dtype=str(dtype).removeprefix("torch."), **options)
    from selfplay.errors import UserError

    raise UserError(f"Unknown backend '{kind}'; choose one of {', '.join(BACKENDS)}.")


__all__ = ["BACKENDS", "PRECISIONS", "Generation", "PolicyBackend", "SamplingSettings", "make_backend", "save_weights"]
