"""Memory per league member: the tensors each frozen snapshot and each exploiter adds to a run.

Counts the bytes of distinct tensor storages (weights, buffers, and AdamW's two moments per
trainable weight), so shared tensors count once: a frozen snapshot (a transformers backend
with its own copy of the weights, as the trainer serves them), a LoRA exploiter on the shared
frozen base (generating with its learner's own model), and an exploiter with its own weights
and its own generation copy, which is what sharing saves. Activations and the KV cache come
on top and depend on the batch.

    python benchmarks/league_memory.py [--model default] [--rank 8]
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForCausalLM

from selfplay.backends import make_backend
from selfplay.config import LearnerConfig, LoraConfig
from selfplay.default_model import resolve_model
from selfplay.learner import Learner


def storages(module: torch.nn.Module) -> dict[int, int]:
    """Distinct storages of a module's tensors: data pointer -> bytes."""
    tensors = [*module.parameters(), *module.buffers()]
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}


def optimizer_bytes(module: torch.nn.Module) -> int:
    return sum(2 * p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--rank", type=int, default=8)
    args = parser.parse_args()
    path = str(resolve_model(args.model))
    mib = 2**20
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    weights = sum(storages(base).values())
    snapshot = sum(storages(make_backend("hf", path).model).values())
    config = LearnerConfig(lora=LoraConfig(rank=args.rank))
    shared = Learner(path, config, shared_base=base)
    backend = make_backend("hf", path, model=shared.model)
    added = {k: v for k, v in storages(backend.model).items() if k not in storages(base)}
    lora = sum(added.values()) + optimizer_bytes(shared.model)
    alone = Learner(path, config)
    own = sum(storages(alone.model).values()) + optimizer_bytes(alone.model) + snapshot
    print(f"model {args.model}: {weights / mib:.2f} MiB of fp32 weights")
    print(f"frozen snapshot (its own copy in an hf backend)   {snapshot / mib:8.2f} MiB  ({snapshot / weights:.3f}x)")
    print(f"LoRA exploiter rank {args.rank}, shared base and model   {lora / mib:8.2f} MiB  ({lora / weights:.3f}x)")
    print(f"LoRA exploiter with its own base and backend copy {own / mib:8.2f} MiB  ({own / weights:.3f}x)")


if __name__ == "__main__":
    main()
