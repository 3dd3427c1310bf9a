"""The memory of a league of N past players at real-model scale: full snapshots against LoRA
adapters, for 0.5B to 8B models on 1 and 8 GPUs of 80 GB, as selfplay holds them today. Shapes
only: no model is downloaded or built (`--check` builds each on PyTorch's meta device, which
allocates nothing, and counts peft's adapter parameters against the formula).

    python benchmarks/league_scaling.py [--ranks 8 16 64] [--players 1 4 16 64] [--tokens 4096]
                                        [--resident 8] [--target-modules q_proj ...] [--check]

What one GPU holds, for the main player and N past players (exploiters aside), in bf16
generation (backend_precision=bf16):

    full fine-tuning   the learner: the sharded learner's plan at the peak of an update
                       (benchmarks/memory_plan.py, learner.processes = GPUs, activation
                       checkpointing, `--tokens` per micro-batch); each past player: a transformers
                       backend with its own bf16 copy of the weights (2 P), every one on the
                       trainer's GPU (cuda:0), whatever the GPU count and the backend.
    LoRA, hf           the learner: one process (learner.processes above 1 is refused with LoRA)
                       keeping the frozen base in fp32 (4 P: learner.precision=bf16 autocasts), its
                       adapter's fp32 weights, gradients and AdamW moments (16 A), checkpointed
                       activations and logits; each past player: its adapter in fp32 (4 A), loaded
                       over the learner's own model, at most league.resident_adapters at once (the
                       rest on disk, loaded again when next met).
    LoRA, vLLM         one engine on cuda:0 with GPU_MEMORY_UTILIZATION of the GPU (it does not
                       sleep under LoRA): bf16 weights (2 P), and max_loras = 1 +
                       league.resident_adapters LoRA slots that vLLM allocates up front at
                       max_lora_rank for every linear layer, whatever the adapters target
                       (2 A' bytes each, A' the all-linear count); the KV cache gets the rest.
                       As many adapters in CPU memory (max_cpu_loras), the rest on disk. The
                       learner as above: beside the engine on one GPU, on a GPU of its own
                       (device=cuda:1) on 8.

An adapter of rank r on a linear layer of shape (out, in) is r (in + out) parameters (peft's
lora_A, r x in, and lora_B, out x r); A sums them over the targeted layers of every decoder layer.
On disk a full snapshot is the fp32 weights (4 P, `export_weights`), an adapter snapshot its
fp32 adapter (4 A, peft's adapter_model.safetensors, plus a config of a few hundred bytes).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from memory_plan import (
    CONFIGS,
    GPUS,
    USABLE_SHARE,
    GiB,
    ModelShape,
    Setup,
    Workload,
    activation_bytes,
    linear_shapes,
    logits_bytes,
    model_shape,
    parameter_count,
    plan,
    print_table,
)

from selfplay.backends.vllm_backend import GPU_MEMORY_UTILIZATION
from selfplay.config import LeagueConfig

# The published config.json of each model (Qwen2.5-0.5B's is memory_plan's):
# https://huggingface.co/Qwen/Qwen2.5-{1.5B,3B}/blob/main/config.json and
# https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json (Llama-3.1-8B has the same
# shapes), as quoted by several public repositories that agree.
MODELS = {
    "Qwen2.5-0.5B": CONFIGS["Qwen2.5-0.5B"],
    "Qwen2.5-1.5B": {
        "model_type": "qwen2",
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    "Qwen2.5-3B": {
        "model_type": "qwen2",
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    "Llama-3-8B": {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
    },
}
PUBLISHED = {"Qwen2.5-0.5B": 0.49e9, "Qwen2.5-1.5B": 1.54e9, "Qwen2.5-3B": 3.09e9, "Llama-3-8B": 8.03e9}
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

SNAPSHOT_BYTES = 2  # a full snapshot's transformers copy, at backend_precision=bf16
LEARNER_BASE_BYTES = 4  # the one-process learner keeps the model's weights in fp32
ADAPTER_BYTES = 4  # a LoRA learner trains and saves its adapter in fp32; a loaded snapshot stays fp32
ADAPTER_STATE_BYTES = 16  # the trained adapter's fp32 weights (4), gradients (4) and AdamW moments (8)
VLLM_BYTES = 2  # the engine's weights and LoRA slots, in the model's dtype (bf16)
DISK_BYTES = 4  # snapshots are written in fp32, whole models and adapters alike
GPU_COUNTS = (1, 8)
GPU = GPUS[0]  # 80 GB


def adapter_parameters(model: ModelShape, rank: int, targets: tuple[str, ...]) -> int:
    """Parameters of a rank-`rank` LoRA adapter on the linear layers `targets` of every decoder layer."""
    shapes = linear_shapes(model)
    return model.num_hidden_layers * sum(rank * (shapes[name][0] + shapes[name][1]) for name in targets)


def peft_adapter_parameters(name: str, rank: int, targets: tuple[str, ...]) -> int:
    """The same count, as peft builds the adapter on the model built from its config on the meta device."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**MODELS[name])
    with torch.device("meta"):
        model = get_peft_model(
            AutoModelForCausalLM.from_config(config), LoraConfig(r=rank, target_modules=list(targets))
        )
    return sum(p.numel() for key, p in model.named_parameters() if "lora_" in key)


def update_bytes(model: ModelShape, tokens: int) -> int:
    """A one-process learner's checkpointed activations and logits at the peak of an update."""
    return activation_bytes(model, tokens, tokens, checkpointing=True, element_bytes=2) + logits_bytes(
        model, tokens, entropy=False
    )


def gib(count: float) -> str:
    return f"{count / GiB:.1f}"


def mib(count: float) -> str:
    return f"{count / 2**20:.1f}"


def print_player_costs(models: list[ModelShape], ranks: tuple[int, ...], targets: tuple[str, ...]) -> None:
    print("\nWhat one past player costs: in GPU memory (a full snapshot's bf16 copy, an adapter in fp32 over the")
    print("learner's model, a vLLM slot in bf16 over every linear layer) and on disk (fp32); share of a full snapshot")
    columns = ["model", "past player", "parameters", "GPU MiB", "vLLM slot MiB", "disk MiB", "GPU share", "disk share"]
    rows = []
    for model in models:
        parameters = parameter_count(model)
        full = [mib(SNAPSHOT_BYTES * parameters), "-", mib(DISK_BYTES * parameters), "100%", "100%"]
        rows.append([model.name, "full snapshot", f"{parameters / 1e6:,.1f} M", *full])
        for rank in ranks:
            adapter = adapter_parameters(model, rank, targets)
            gpu, slot = ADAPTER_BYTES * adapter, VLLM_BYTES * adapter_parameters(model, rank, ALL_LINEAR)
            shares = [f"{gpu / (SNAPSHOT_BYTES * parameters):.2%}", f"{adapter / parameters:.2%}"]
            rows.append(
                [
                    "",
                    f"LoRA r{rank}",
                    f"{adapter / 1e6:,.1f} M",
                    mib(gpu),
                    mib(slot),
                    mib(DISK_BYTES * adapter),
                    *shares,
                ]
            )
    print_table(columns, rows)


@dataclass(frozen=True)
class Settings:
    ranks: tuple[int, ...]
    players: tuple[int, ...]  # league sizes N
    resident: int  # league.resident_adapters
    tokens: int  # per learner micro-batch
    targets: tuple[str, ...]  # the linear layers the adapters adapt


def league_rows(model: ModelShape, gpus: int, settings: Settings) -> list[list[str]]:
    """One row per design: GiB of the learner on its GPU and of the engine (vLLM), then for each N
    the GiB the league holds on the busiest GPU; 'no' where a GPU's total passes its budget."""
    usable = USABLE_SHARE * GPU.memory
    parameters = parameter_count(model)
    full_learner = plan(model, Setup(gpus, checkpointing=True, offload=False), Workload(settings.tokens)).update
    snapshots = [n * SNAPSHOT_BYTES * parameters for n in settings.players]
    full_cells = [cell(s, full_learner + s <= usable) for s in snapshots]
    rows = [[model.name, "full, hf copies", cell(full_learner, full_learner <= usable), "-", *full_cells]]
    engine_budget = GPU_MEMORY_UTILIZATION * GPU.memory
    for rank in settings.ranks:
        adapter = adapter_parameters(model, rank, settings.targets)
        learner = LEARNER_BASE_BYTES * parameters + ADAPTER_STATE_BYTES * adapter + update_bytes(model, settings.tokens)
        held = [min(n, settings.resident) * ADAPTER_BYTES * adapter for n in settings.players]
        hf_cells = [cell(h, learner + h <= usable) for h in held]
        rows.append([model.name, f"LoRA r{rank}, hf", cell(learner, learner <= usable), "-", *hf_cells])
        # The engine's slots (the learning player's and league.resident_adapters snapshots') are
        # allocated when it starts, whatever N; the learner shares cuda:0 on one GPU, has cuda:1 on 8.
        slot = VLLM_BYTES * adapter_parameters(model, rank, ALL_LINEAR)
        engine = VLLM_BYTES * parameters + (1 + settings.resident) * slot
        learner_fits = learner <= (usable - engine_budget if gpus == 1 else usable)
        engine_fits = engine <= engine_budget
        slots = [cell(settings.resident * slot, learner_fits and engine_fits) for _ in settings.players]
        rows.append([model.name, f"LoRA r{rank}, vLLM", cell(learner, learner_fits), cell(engine, engine_fits), *slots])
    return rows


def cell(count: float, fits: bool) -> str:
    return f"{count / GiB:.2f}" if fits else f"{count / GiB:.2f} no"


def print_league(models: list[ModelShape], gpus: int, settings: Settings) -> None:
    print(f"\nA league of N past players on {gpus} GPU{'s' if gpus > 1 else ''} of {GPU.name}: GiB the league holds on")
    print("the busiest GPU ('no': a GPU's total passes its budget); learner and engine GiB on their GPUs")
    columns = ["model", "snapshots", "learner", "vLLM engine", *(f"N={n}" for n in settings.players)]
    print_table(columns, [row for model in models for row in league_rows(model, gpus, settings)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 16, 64])
    parser.add_argument("--players", type=int, nargs="+", default=[1, 4, 16, 64], help="past players N")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per learner micro-batch, all scored")
    parser.add_argument(
        "--resident", type=int, default=LeagueConfig().resident_adapters, help="league.resident_adapters"
    )
    parser.add_argument("--target-modules", nargs="+", default=list(ALL_LINEAR), choices=ALL_LINEAR)
    parser.add_argument("--check", action="store_true", help="count each adapter with peft on the meta device too")
    args = parser.parse_args()
    settings = Settings(tuple(args.ranks), tuple(args.players), args.resident, args.tokens, tuple(args.target_modules))
    models = [model_shape(name, config) for name, config in MODELS.items()]
    if args.check:
        for model in models:
            for rank in settings.ranks:
                counted = peft_adapter_parameters(model.name, rank, settings.targets)
                expected = adapter_parameters(model, rank, settings.targets)
                assert counted == expected, f"{model.name} rank {rank}: peft {counted}, formula {expected}"
        print("adapter parameter counts: the formula's are peft's, every model and rank")
    print(f"LoRA on {', '.join(settings.targets)}")
    print(
        f"league.resident_adapters={settings.resident}; learner micro-batches of {settings.tokens} tokens, checkpointed"
    )
    engine = f"the vLLM engine {GPU_MEMORY_UTILIZATION:.0%} of it, the learner beside it the rest"
    print(f"budgets: {USABLE_SHARE:.0%} of a GPU; {engine}")
    for model in models:
        published = PUBLISHED[model.name]
        print(f"{model.name}: {parameter_count(model) / 1e9:.3f} B parameters (model card: {published / 1e9:g} B)")
    print_player_costs(models, settings.ranks, settings.targets)
    for gpus in GPU_COUNTS:
        print_league(models, gpus, settings)


if __name__ == "__main__":
    main()
