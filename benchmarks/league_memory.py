"""Memory per league member: the tensors each frozen snapshot and each exploiter adds to a run,
and what a snapshot costs on disk.

Counts the bytes of distinct tensor storages (weights, buffers, and AdamW's two moments per
trainable weight), so shared tensors count once: a full learner's frozen snapshot (a
transformers backend with its own copy of the weights), a LoRA learner's (its adapter, resident
over the main learner's own model: `AdapterPool`), a LoRA exploiter on the shared frozen base
(generating with its learner's own model), and an exploiter with its own weights and its own
generation copy, which is what sharing saves. On disk: a full snapshot's safetensors file against
a LoRA learner's adapter directory. Activations and the KV cache come on top and depend on the
batch.

    python benchmarks/league_memory.py [--model default] [--rank 8]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from selfplay.backends import make_backend
from selfplay.backends.hf_backend import AdapterPool
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
    with tempfile.TemporaryDirectory() as scratch:
        full_file = alone.export_weights(Path(scratch) / "full.safetensors")
        adapter_dir = alone.export_adapter(Path(scratch) / "adapter")
        on_disk = full_file.stat().st_size, sum(f.stat().st_size for f in adapter_dir.iterdir())
        held = storages(shared.model)
        with AdapterPool(shared.model, capacity=1).selected("snapshot", adapter_dir):
            adapter = sum(v for k, v in storages(shared.model).items() if k not in held)
    print(f"model {args.model}: {weights / mib:.2f} MiB of fp32 weights")
    rows = {
        "full snapshot (its own copy in an hf backend)": snapshot,
        f"LoRA snapshot rank {args.rank} (an adapter over the learner)": adapter,
        f"LoRA exploiter rank {args.rank}, shared base and model": lora,
        "LoRA exploiter with its own base and backend copy": own,
    }
    for label, size in rows.items():
        print(f"{label:<52}{size / mib:8.2f} MiB  ({size / weights:.4f}x)")
    full_disk, adapter_disk = on_disk
    print(
        f"on disk: full snapshot {full_disk / mib:.2f} MiB, adapter snapshot {adapter_disk / mib:.3f} MiB "
        f"({adapter_disk / full_disk:.2%} of the full one)"
    )


if __name__ == "__main__":
    main()
