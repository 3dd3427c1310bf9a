"""benchmarks/memory_plan.py: its parameter counts against transformers' models, its sharded
state against hand-computed shares, and its activation formula against what autograd saves."""

import math

import pytest
import torch
import transformers

from benchmarks.memory_plan import (
    CONFIGS,
    PUBLISHED,
    decoder_layer_shapes,
    layer_activation_bytes_per_token,
    model_shape,
    parameter_count,
    root_shapes,
    sharded_state_bytes,
)

TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
)


def tiny_model(family: str, **overrides) -> transformers.PreTrainedModel:
    if family == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**{**TINY, **overrides}))
    # A head size other than hidden_size / heads, so that the count must read head_dim.
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**{**TINY, "head_dim": 24, **overrides}))


@pytest.mark.parametrize(
    "family, overrides",
    [
        ("qwen2", {"tie_word_embeddings": True}),
        ("qwen2", {"tie_word_embeddings": False}),
        ("qwen3", {"tie_word_embeddings": True}),
        ("qwen3", {"tie_word_embeddings": False}),
        ("qwen3", {"tie_word_embeddings": False, "attention_bias": True}),
    ],
)
def test_parameter_count_matches_transformers(family, overrides):
    model = tiny_model(family, **overrides)
    shape = model_shape("tiny", model.config.to_dict())
    assert parameter_count(shape) == sum(p.numel() for p in model.parameters())
    planned = decoder_layer_shapes(shape) * shape.num_hidden_layers + root_shapes(shape)
    assert sorted(planned) == sorted(tuple(p.shape) for p in model.parameters())


def test_planned_models_match_their_model_cards():
    for name, config in CONFIGS.items():
        shape = model_shape(name, config)
        assert parameter_count(shape) == pytest.approx(PUBLISHED[name], rel=0.01), name
        # sharded_state_bytes rounds the total up in place of FSDP2's padding of each dim 0: exact here.
        assert all(dims[0] % 16 == 0 for dims in decoder_layer_shapes(shape) + root_shapes(shape)), name


def test_qwen25_half_billion_count_is_exact():
    # 24 layers of 14,912,384 (attention 1,836,160 with q/k/v biases, MLP 13,074,432, norms 1,792)
    # plus tied embeddings 151,936 x 896 and the final norm's 896.
    assert parameter_count(model_shape("Qwen2.5-0.5B", CONFIGS["Qwen2.5-0.5B"])) == 494_032_768


def test_sharded_state_is_an_even_share_rounded_up():
    assert sharded_state_bytes(1000, 1000, 8) == {"parameters": 500, "gradients": 500, "optimizer": 1000}
    # 1001 / 8 rounds up to 126 elements per process.
    assert sharded_state_bytes(1001, 1001, 8) == {"parameters": 504, "gradients": 504, "optimizer": 1008}
    # A frozen base under LoRA: every weight is sharded, only the trainable ones have gradients and moments.
    assert sharded_state_bytes(1000, 10, 4) == {"parameters": 1000, "gradients": 12, "optimizer": 24}
    # bf16 master weights and gradients, as without fp32 masters.
    assert sharded_state_bytes(1000, 1000, 1, master_bytes=2, grad_bytes=2) == {
        "parameters": 2000,
        "gradients": 2000,
        "optimizer": 8000,
    }
    for processes in (1, 3, 8, 16):
        share = sum(sharded_state_bytes(10**9 + 7, 10**9 + 7, processes).values())
        assert 16 * (10**9 + 7) <= processes * share < 16 * (10**9 + 7 + processes)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_layer_activations_match_what_autograd_saves(family):
    """The bytes of the distinct tensors autograd keeps in one bf16 decoder layer (weights and
    the rotary tables, which are not per layer, left out) per token, against the formula."""
    model = tiny_model(family, hidden_size=256, intermediate_size=768, num_attention_heads=8, head_dim=32)
    model = model.to(torch.bfloat16)
    tokens = 256
    hidden = torch.randn(1, tokens, 256, dtype=torch.bfloat16, requires_grad=True)
    positions = torch.arange(tokens)[None]
    cos, sin = model.model.rotary_emb(hidden, positions)
    not_activations = {t.untyped_storage().data_ptr() for t in (*model.parameters(), cos, sin)}
    saved: dict[int, int] = {}

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in not_activations:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        model.model.layers[0](hidden, position_embeddings=(cos, sin), position_ids=positions)
    formula = layer_activation_bytes_per_token(model_shape("tiny", model.config.to_dict()), element_bytes=2)
    assert math.isclose(sum(saved.values()) / tokens, formula, rel_tol=0.01)
