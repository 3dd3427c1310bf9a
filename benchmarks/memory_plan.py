"""Memory plan of the sharded learner: the bytes each GPU holds when `learner.processes=N` shards
a model with PyTorch FSDP2, for any Hugging Face config, and the largest model that fits.

    python benchmarks/memory_plan.py [--tokens 16384] [--response-share 1.0] [--entropy]
                                     [--vllm] [--kv-tokens 131072] [--fp32] [--config config.json ...]

The plan is for the peak, the start of the backward pass: every activation is saved, the logits
and their gradient are live, and FSDP2 holds the root's parameters (embeddings, final norm,
output head) unsharded from the forward pass to the end of the backward. With P parameters,
N processes, L decoder layers, T tokens per micro-batch of which R are scored (response
positions), vocabulary V, width h, e bytes per activation element (2 in bf16), a process holds:

    sharded state   16 P / N: fp32 master weights (4), fp32 gradients (4), AdamW's two fp32
                    moments (8). The 16 bytes per parameter of mixed-precision Adam, sharded
                    N ways as ZeRO-3 does (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations
                    Toward Training Trillion Parameter Models", section 5.1). With CPU offload it
                    lives in CPU memory and the GPU keeps none of it.
    working         unsharded bf16 parameters of 2 decoder layers (the one computing and the one
                    all-gathered ahead) and of the root; the unsharded gradients of 1 layer, in
                    bf16 and in the fp32 buffer FSDP2 reduce-scatters from; and the output head's
                    bf16 gradient V h, the first the backward pass computes, which waits for the
                    root's reduce-scatter at its end.
    activations     per process, not sharded: T L a without activation checkpointing; with it,
                    T (L e h + a), one hidden state per layer boundary plus the one layer being
                    recomputed. Outside the layers: the final norm's (4 + e) h T and the output
                    head's input e h R.
    logits          3 R V 4: fp32 log-softmax kept for backward, its gradient and the logits'
                    gradient (5 with the entropy bonus).
    vLLM            with `--vllm`, the colocated engine's bf16 weights, 2 P, not sharded; and
                    while it generates (the learner's activations freed, its state kept), a KV
                    cache of `--kv-tokens` tokens, 2 L 2 n_kv d bytes each.

The activations of one decoder layer per token, a, count every tensor autograd saves, as
Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
section 4.1) count 34 s b h + 5 n s^2 b bytes for a GPT layer of n heads. Redone for a
Qwen/Llama layer (RMSNorm, grouped-query attention with n_q query heads and n_kv key/value heads
of size d, SwiGLU MLP of width I), with flash/SDPA attention (no s^2 score matrix: Dao et al.
2022) and no dropout (RL fine-tuning turns it off, so no masks):

    a = 2 (4 + e) h          two RMSNorms: transformers upcasts each input to an fp32 copy it
                             keeps, and keeps the normalized output
      + 2 e h                the input of q/k/v and the input of gate/up
      + 2 e n_q d            queries, and the attention output (also the o projection's input)
      + 2 e n_kv d           keys and values (SDPA's GQA path keeps them unrepeated)
      + 4 n_q                the attention's fp32 log-sum-exp per head
      + 4 e I                gate and up outputs, SiLU(gate), and their product (down's input)
      + (4 + e)(n_q + n_kv) d   Qwen3's RMSNorm over each head's queries and keys

In bf16 that is 16 h + 4 n_q d + 4 n_kv d + 8 I (+ 6 n_q d + 6 n_kv d for Qwen3) bytes, within
1% of the tensors autograd saves in a transformers Qwen2 or Qwen3 decoder layer (as
tests/test_memory_plan.py checks).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

GiB = 1 << 30

# What each process keeps between steps, per parameter (FSDP2 with MixedPrecisionPolicy(
# param_dtype=bf16, reduce_dtype=fp32)).
MASTER_BYTES = 4  # the sharded parameters stay fp32: the optimizer steps them
GRAD_BYTES = 4  # sharded gradients in the parameters' dtype, accumulated across micro-batches
OPTIMIZER_BYTES = 8  # AdamW's exp_avg and exp_avg_sq, fp32 each
# What a forward and backward pass works in.
BF16_BYTES = 2  # mixed precision: unsharded parameters, their gradients and activations in bf16
FP32_BYTES = 4  # without mixed precision (`--fp32`) they are all fp32
REDUCE_BYTES = 4  # reduce_dtype=fp32: FSDP2 copies a group's gradients into an fp32 buffer to reduce-scatter
UNSHARDED_LAYERS = 2  # the decoder layer computing and the next, all-gathered ahead (FSDP2's implicit prefetch)
REDUCING_LAYERS = 1  # a layer's unsharded gradients are freed once reduce-scattered, before the next layer's
NORM_COPY_BYTES = 4  # transformers' RMSNorm upcasts its input to fp32 and keeps that copy for backward
LOGSUMEXP_BYTES = 4  # flash/SDPA attention keeps one fp32 log-sum-exp per head and token for backward
# The scored positions' fp32 vocabulary-wide tensors live at once, measured around
# selfplay.scoring.response_logprobs_and_entropy and its backward (peak resident memory on CPU):
# the log-softmax it keeps, its incoming gradient and the logits' gradient; the entropy bonus
# keeps exp(log-softmax) and the product with it as well.
LOGITS_COPIES = 3
LOGITS_COPIES_WITH_ENTROPY = 5
LOGITS_BYTES = 4  # the learner scores in fp32 (`.float()` on the output head's result)
VLLM_WEIGHT_BYTES = 2  # the generation engine serves bf16 weights, one whole copy per GPU (no tensor parallelism)
KV_CACHE_BYTES = 2  # bf16 keys and values
# vLLM's own default gpu_memory_utilization: the rest of a GPU goes to the CUDA context, NCCL's
# buffers and the caching allocator's fragmentation, the rest of CPU memory to the operating
# system and the rollouts, which the plan does not count.
USABLE_SHARE = 0.9
CPU_MEMORY_PER_GPU = (2 << 40) // 8  # a DGX H100 or H200: 2 TiB of system memory for 8 GPUs

# The learner's default micro-batch (LearnerConfig.micro_batch_tokens).
MICRO_BATCH_TOKENS = 16384
# KV cache the engine needs while it generates: 32 sequences of 4096 tokens (SPIRAL's
# max_new_tokens, configs/spiral.yaml) in flight at once.
KV_CACHE_TOKENS = 32 * 4096
PROCESS_COUNTS = (1, 8, 16)


@dataclass(frozen=True)
class Gpu:
    name: str
    memory: int  # bytes, as nvidia-smi reports the total


GPUS = (Gpu("80 GB", 81559 << 20), Gpu("141 GB", 143771 << 20))  # H100 SXM 80GB, H200


# -- the model -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """The fields of a Hugging Face config.json that size a Qwen2, Qwen3 or Llama model."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool  # the output head is the embedding matrix
    qkv_bias: bool  # biases on the q, k and v projections (Qwen2 always; Qwen3 and Llama with attention_bias)
    o_bias: bool  # a bias on the output projection (Qwen3 and Llama with attention_bias; never Qwen2)
    qk_norm: bool  # RMSNorm over each head's queries and keys (Qwen3)


def model_shape(name: str, config: dict) -> ModelShape:
    """The shape of a model from its config.json fields."""
    qwen2 = config["model_type"] == "qwen2"
    attention_bias = bool(config.get("attention_bias"))
    return ModelShape(
        name=name,
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_hidden_layers=config["num_hidden_layers"],
        num_attention_heads=config["num_attention_heads"],
        num_key_value_heads=config["num_key_value_heads"],
        head_dim=config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"],
        vocab_size=config["vocab_size"],
        tie_word_embeddings=config["tie_word_embeddings"],
        qkv_bias=qwen2 or attention_bias,
        o_bias=not qwen2 and attention_bias,
        qk_norm=config["model_type"] == "qwen3",
    )


# The config.json fields of the planned models. The Qwen3 ones are those of
# https://huggingface.co/Qwen/Qwen3-{4B,8B,14B,32B}/blob/main/config.json, as copied in
# github.com/citsjtu2020/LLM-Prof (sglang/Model_Config.md); the Qwen2.5 ones those of
# https://huggingface.co/Qwen/Qwen2.5-{0.5B,72B}/blob/main/config.json, as quoted by several public
# repositories that agree (Qwen2 keeps no head_dim: it is hidden_size / num_attention_heads).
# PUBLISHED holds each model card's parameter count.
# The fields the Qwen3 configs below share.
QWEN3 = {"model_type": "qwen3", "head_dim": 128, "attention_bias": False, "vocab_size": 151936}
CONFIGS = {
    "Qwen2.5-0.5B": {
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    "Qwen3-4B": {
        **QWEN3,
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "tie_word_embeddings": True,
    },
    "Qwen3-8B": {
        **QWEN3,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
    },
    "Qwen3-14B": {
        **QWEN3,
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "num_hidden_layers": 40,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
    },
    "Qwen3-32B": {
        **QWEN3,
        "hidden_size": 5120,
        "intermediate_size": 25600,
        "num_hidden_layers": 64,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
    },
    "Qwen2.5-72B": {
        "model_type": "qwen2",
        "hidden_size": 8192,
        "intermediate_size": 29568,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
    },
}
PUBLISHED = {
    "Qwen2.5-0.5B": 0.49e9,
    "Qwen3-4B": 4.0e9,
    "Qwen3-8B": 8.2e9,
    "Qwen3-14B": 14.8e9,
    "Qwen3-32B": 32.8e9,
    "Qwen2.5-72B": 72.7e9,
}


def linear_shapes(model: ModelShape) -> dict[str, tuple[int, int]]:
    """The weight shapes (out, in) of one decoder layer's linear layers, by transformers' names:
    every layer LoRA can adapt (the output head aside)."""
    h, i = model.hidden_size, model.intermediate_size
    q, kv = model.num_attention_heads * model.head_dim, model.num_key_value_heads * model.head_dim
    return {
        "q_proj": (q, h),
        "k_proj": (kv, h),
        "v_proj": (kv, h),
        "o_proj": (h, q),
        "gate_proj": (i, h),
        "up_proj": (i, h),
        "down_proj": (h, i),
    }


def decoder_layer_shapes(model: ModelShape) -> list[tuple[int, ...]]:
    """The parameter shapes of one decoder layer, as transformers builds them (out, in)."""
    h, d = model.hidden_size, model.head_dim
    q, kv = model.num_attention_heads * d, model.num_key_value_heads * d
    shapes: list[tuple[int, ...]] = list(linear_shapes(model).values())
    if model.qkv_bias:
        shapes += [(q,), (kv,), (kv,)]
    if model.o_bias:
        shapes += [(h,)]
    if model.qk_norm:
        shapes += [(d,), (d,)]  # one RMSNorm weight shared by all query heads, one by all key heads
    shapes += [(h,), (h,)]  # RMSNorm before attention and before the MLP
    return shapes


def root_shapes(model: ModelShape) -> list[tuple[int, ...]]:
    """The parameter shapes outside the decoder layers: what the root fully_shard holds."""
    shapes = [(model.vocab_size, model.hidden_size), (model.hidden_size,)]  # embeddings, final RMSNorm
    if not model.tie_word_embeddings:
        shapes.append((model.vocab_size, model.hidden_size))  # output head
    return shapes


def numel(shapes: list[tuple[int, ...]]) -> int:
    return sum(math.prod(shape) for shape in shapes)


def parameter_count(model: ModelShape) -> int:
    return model.num_hidden_layers * numel(decoder_layer_shapes(model)) + numel(root_shapes(model))


# -- what a process holds ------------------------------------------------------------------


def sharded_state_bytes(
    parameters: int,
    trainable: int,
    processes: int,
    master_bytes: int = MASTER_BYTES,
    grad_bytes: int = GRAD_BYTES,
    optimizer_bytes: int = OPTIMIZER_BYTES,
) -> dict[str, int]:
    """Bytes of the state one of `processes` keeps between steps when FSDP2 shards `parameters`
    weights of which `trainable` have gradients and optimizer state (all of them but a frozen
    base under LoRA): each count split evenly, rounded up. FSDP2 splits each parameter's dim 0
    and pads it to a multiple of N rows; rounding the total up is exact when every dim 0 divides
    by N, as it does for every model planned here and N up to 16."""
    parameter_share, trainable_share = -(-parameters // processes), -(-trainable // processes)  # rounded up
    return {
        "parameters": parameter_share * master_bytes,
        "gradients": trainable_share * grad_bytes,
        "optimizer": trainable_share * optimizer_bytes,
    }


def layer_activation_bytes_per_token(model: ModelShape, element_bytes: int) -> int:
    """What autograd saves in one decoder layer for one token (the module docstring's a)."""
    h, e = model.hidden_size, element_bytes
    q = model.num_attention_heads * model.head_dim
    kv = model.num_key_value_heads * model.head_dim
    norms = 2 * (NORM_COPY_BYTES + e) * h
    projection_inputs = 2 * e * h
    attention = 2 * e * q + 2 * e * kv + LOGSUMEXP_BYTES * model.num_attention_heads
    mlp = 4 * e * model.intermediate_size
    qk_norms = (NORM_COPY_BYTES + e) * (q + kv) if model.qk_norm else 0
    return norms + projection_inputs + attention + mlp + qk_norms


def activation_bytes(model: ModelShape, tokens: int, scored: int, checkpointing: bool, element_bytes: int) -> int:
    """Activations of one micro-batch of `tokens` tokens, `scored` of them response positions."""
    layer = layer_activation_bytes_per_token(model, element_bytes)
    h, layers = model.hidden_size, model.num_hidden_layers
    if checkpointing:  # each layer keeps its input; the one being recomputed keeps everything
        decoder = tokens * (layers * element_bytes * h + layer)
    else:
        decoder = tokens * layers * layer
    final_norm = (NORM_COPY_BYTES + element_bytes) * h * tokens
    head_input = element_bytes * h * scored
    return decoder + final_norm + head_input


def logits_bytes(model: ModelShape, scored: int, entropy: bool) -> int:
    copies = LOGITS_COPIES_WITH_ENTROPY if entropy else LOGITS_COPIES
    return copies * scored * model.vocab_size * LOGITS_BYTES


def working_bytes(model: ModelShape, compute_bytes: int) -> int:
    """Unsharded parameters and gradients early in the backward pass: the layers all-gathered,
    the root all-gathered throughout, a layer's gradients on their way to the reduce-scatter and
    the output head's gradient waiting for the root's (the rest of the root's comes at the end,
    when the activations are gone)."""
    layer, root = numel(decoder_layer_shapes(model)), numel(root_shapes(model))
    parameters = (UNSHARDED_LAYERS * layer + root) * compute_bytes
    layer_gradients = REDUCING_LAYERS * layer * (compute_bytes + REDUCE_BYTES)
    head_gradient = model.vocab_size * model.hidden_size * compute_bytes
    return parameters + layer_gradients + head_gradient


def kv_cache_bytes(model: ModelShape, tokens: int) -> int:
    per_token = model.num_hidden_layers * 2 * model.num_key_value_heads * model.head_dim * KV_CACHE_BYTES
    return tokens * per_token


@dataclass(frozen=True)
class Setup:
    processes: int
    checkpointing: bool
    offload: bool  # CPUOffloadPolicy: the sharded state lives in CPU memory
    mixed_precision: bool = True  # bf16 compute over fp32 master weights; False computes in fp32


@dataclass(frozen=True)
class Workload:
    tokens: int = MICRO_BATCH_TOKENS  # per micro-batch and process
    scored_tokens: int = MICRO_BATCH_TOKENS  # response positions among them
    entropy_bonus: bool = False
    vllm: bool = False  # a vLLM engine shares each GPU
    kv_cache_tokens: int = KV_CACHE_TOKENS


@dataclass(frozen=True)
class GpuPlan:
    """Bytes on one GPU, and the CPU memory its process keeps with offload."""

    sharded_state: int
    working: int
    activations: int
    logits: int
    vllm_weights: int
    kv_cache: int
    cpu_state: int

    @property
    def update(self) -> int:
        """While the learner updates (vLLM asleep: its KV cache released, its weights kept)."""
        return self.sharded_state + self.working + self.activations + self.logits + self.vllm_weights

    @property
    def generation(self) -> int:
        """While vLLM generates: the learner's state stays, its activations are gone."""
        return self.sharded_state + self.vllm_weights + self.kv_cache

    @property
    def peak(self) -> int:
        return max(self.update, self.generation)

    def fits(self, gpu: Gpu) -> bool:
        return self.peak <= USABLE_SHARE * gpu.memory and self.cpu_state <= USABLE_SHARE * CPU_MEMORY_PER_GPU


def plan(model: ModelShape, setup: Setup, workload: Workload) -> GpuPlan:
    parameters = parameter_count(model)
    state = sum(sharded_state_bytes(parameters, parameters, setup.processes).values())
    compute_bytes = BF16_BYTES if setup.mixed_precision else FP32_BYTES
    return GpuPlan(
        sharded_state=0 if setup.offload else state,
        working=working_bytes(model, compute_bytes),
        activations=activation_bytes(
            model, workload.tokens, workload.scored_tokens, setup.checkpointing, compute_bytes
        ),
        logits=logits_bytes(model, workload.scored_tokens, workload.entropy_bonus),
        vllm_weights=VLLM_WEIGHT_BYTES * parameters if workload.vllm else 0,
        kv_cache=kv_cache_bytes(model, workload.kv_cache_tokens) if workload.vllm else 0,
        cpu_state=state if setup.offload else 0,
    )


def setups(mixed_precision: bool) -> list[Setup]:
    """Every process count, with and without activation checkpointing and CPU offload."""
    return [
        Setup(processes, checkpointing, offload, mixed_precision)
        for processes in PROCESS_COUNTS
        for checkpointing in (False, True)
        for offload in (False, True)
    ]


# -- the tables ------------------------------------------------------------------------------


def gib(count: int) -> str:
    return f"{count / GiB:.1f}"


def print_model_table(model: ModelShape, setups: list[Setup], workload: Workload) -> None:
    parameters = parameter_count(model)
    published = f" (model card: {PUBLISHED[model.name] / 1e9:g} B)" if model.name in PUBLISHED else ""
    print(f"\n{model.name}: {parameters / 1e9:.3f} B parameters{published}, {model.num_hidden_layers} layers")
    columns = ["GPUs", "ckpt", "offload", "state", "working", "activations", "logits"]
    columns += ["vLLM", "generating"] if workload.vllm else []
    columns += ["peak", *(f"fits {gpu.name}" for gpu in GPUS), "CPU/GPU"]
    rows = []
    for setup in setups:
        gpu_plan = plan(model, setup, workload)
        row = [str(setup.processes), "yes" if setup.checkpointing else "no", "yes" if setup.offload else "no"]
        row += [gib(b) for b in (gpu_plan.sharded_state, gpu_plan.working, gpu_plan.activations, gpu_plan.logits)]
        if workload.vllm:
            row += [gib(gpu_plan.vllm_weights), gib(gpu_plan.generation)]
        row += [gib(gpu_plan.peak), *("yes" if gpu_plan.fits(gpu) else "no" for gpu in GPUS), gib(gpu_plan.cpu_state)]
        rows.append(row)
    print_table(columns, rows)


def print_largest(models: list[ModelShape], setups: list[Setup], workload: Workload) -> None:
    """The largest of `models` (by parameter count) that fits each setup and GPU."""
    print("\nLargest listed model that fits (GiB at peak)")
    by_size = sorted(models, key=parameter_count, reverse=True)
    rows = []
    for setup in setups:
        row = [str(setup.processes), "yes" if setup.checkpointing else "no", "yes" if setup.offload else "no"]
        for gpu in GPUS:
            fitting = [m for m in by_size if plan(m, setup, workload).fits(gpu)]
            row.append(f"{fitting[0].name} ({gib(plan(fitting[0], setup, workload).peak)})" if fitting else "none")
        rows.append(row)
    print_table(["GPUs", "ckpt", "offload", *(gpu.name for gpu in GPUS)], rows)


def print_table(columns: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(cell) for cell in column) for column in zip(columns, *rows)]
    for line in [columns, ["-" * width for width in widths], *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=MICRO_BATCH_TOKENS, help="tokens per micro-batch and process")
    parser.add_argument(
        "--response-share",
        type=float,
        default=1.0,
        help="share of the tokens that are scored response positions (1.0: the bound, every position)",
    )
    parser.add_argument("--entropy", action="store_true", help="with the entropy bonus (learner.entropy_coef > 0)")
    parser.add_argument("--vllm", action="store_true", help="a vLLM engine shares each GPU")
    parser.add_argument("--kv-tokens", type=int, default=KV_CACHE_TOKENS, help="KV cache vLLM generates with")
    parser.add_argument("--fp32", action="store_true", help="no mixed precision: compute in fp32")
    parser.add_argument("--config", type=Path, action="append", default=[], help="also plan this config.json")
    args = parser.parse_args()

    models = [model_shape(name, config) for name, config in CONFIGS.items()]
    models += [model_shape(path.parent.name or path.stem, json.loads(path.read_text())) for path in args.config]
    workload = Workload(
        tokens=args.tokens,
        scored_tokens=round(args.tokens * args.response_share),
        entropy_bonus=args.entropy,
        vllm=args.vllm,
        kv_cache_tokens=args.kv_tokens,
    )
    settings = [f"micro-batch: {workload.tokens} tokens per process, {workload.scored_tokens} of them scored"]
    settings += ["fp32" if args.fp32 else "bf16 mixed precision"]
    settings += ["entropy bonus"] if workload.entropy_bonus else []
    settings += [f"vLLM on each GPU, generating with a KV cache of {args.kv_tokens} tokens"] if args.vllm else []
    print("GiB per GPU at the peak of an update")
    print("; ".join(settings))
    print(
        f"fits: peak <= {USABLE_SHARE:.0%} of the GPU, and CPU/GPU (what a process keeps in CPU memory with offload) "
        f"<= {USABLE_SHARE:.0%} of {gib(CPU_MEMORY_PER_GPU)} GiB"
    )
    planned = setups(mixed_precision=not args.fp32)
    for model in models:
        print_model_table(model, planned, workload)
    print_largest(models, planned, workload)


if __name__ == "__main__":
    main()
