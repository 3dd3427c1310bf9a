"""Scoring responses: the shared-prefix forward pass gives what a plain forward pass gives."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from selfplay.scoring import response_hidden, response_logprobs_and_entropy  # noqa: E402

# Three prompts sharing a 5-token prefix, responses of different lengths (right padding).
PROMPTS = [[7, 8, 9, 10, 11, 20, 21], [7, 8, 9, 10, 11, 30], [7, 8, 9, 10, 11, 40, 41, 42]]
RESPONSES = [[50, 51], [60, 61, 62], [70]]


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def plain_hidden(model, prompt, response):
    """Hidden states of one unpadded sequence, by a plain forward pass."""
    with torch.no_grad():
        return model.get_decoder()(input_ids=torch.tensor([prompt + response])).last_hidden_state[0]


# Prompts that several responses share (a sample group, a probe's legal moves), each row's
# responses of any length, one prompt with no prefix in common with the rest.
SHARED_PROMPTS = [PROMPTS[0], PROMPTS[1], PROMPTS[0], PROMPTS[2], PROMPTS[1], PROMPTS[0]]
SHARED_RESPONSES = [[50, 51], [60], [52, 53, 54], [70, 71], [61, 62, 63, 64], [55]]


@pytest.mark.parametrize(
    "prompts, responses",
    [
        (PROMPTS, RESPONSES),
        (SHARED_PROMPTS, SHARED_RESPONSES),
        ([[3, 4], *SHARED_PROMPTS], [[5], *SHARED_RESPONSES]),
        ([PROMPTS[0], PROMPTS[2], PROMPTS[0]], [[50], [70], [51]]),
    ],
    ids=["distinct", "shared", "no common prefix", "one-token responses"],
)
def test_response_hidden_and_entropy_match_a_plain_forward_pass(model, prompts, responses):
    with torch.no_grad():
        hidden = response_hidden(model, prompts, responses)
        logprobs, entropies = response_logprobs_and_entropy(model, prompts, responses)
    assert hidden.shape[0] == sum(map(len, responses))
    start = 0
    for prompt, response, logp, entropy in zip(prompts, responses, logprobs, entropies):
        plain = plain_hidden(model, prompt, response)[len(prompt) - 1 : len(prompt) - 1 + len(response)]
        assert torch.allclose(hidden[start : start + len(response)], plain, atol=1e-5)
        distribution = torch.log_softmax(model.get_output_embeddings()(plain), dim=-1)
        assert torch.allclose(logp, distribution[range(len(response)), response], atol=1e-5)
        assert torch.allclose(entropy, -(distribution.exp() * distribution).sum(-1), atol=1e-4)
        start += len(response)


def test_bf16_counts_as_native_on_accelerators_and_non_x86_cpus_and_by_instructions_on_x86(monkeypatch):
    import platform

    from selfplay.scoring import bf16_is_native

    assert bf16_is_native("cuda")
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    for avx512_bf16, amx in [(False, False), (True, False), (False, True)]:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda answer=avx512_bf16: answer)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda answer=amx: answer)
        assert bf16_is_native("cpu") == (avx512_bf16 or amx)
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert bf16_is_native("cpu")


def gradients(model, prompts, responses, share_prefix):
    model.zero_grad(set_to_none=True)
    logprobs, _ = response_logprobs_and_entropy(model, prompts, responses, share_prefix=share_prefix)
    torch.cat(logprobs).sum().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_gradients_through_shared_prompts_are_those_of_whole_rows_and_repeat_to_the_bit(model):
    """Rows gather their prompt's keys and values; on several threads a gather whose backward adds
    the rows' gradients in whatever order the threads reach them would differ from run to run."""
    generator = torch.Generator().manual_seed(0)
    distinct = [[7, 8, 9, *torch.randint(3, 200, (24,), generator=generator).tolist()] for _ in range(8)]
    prompts = [distinct[row % len(distinct)] for row in range(128)]  # each prompt's rows apart
    responses = [torch.randint(3, 200, (1 + row % 4,), generator=generator).tolist() for row in range(128)]
    whole = gradients(model, prompts, responses, share_prefix=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        repeats = [gradients(model, prompts, responses, share_prefix=True) for _ in range(6)]
    finally:
        torch.set_num_threads(threads)
    shared = repeats[0]
    assert shared.keys() == whole.keys() and len(shared) > 10
    for name in shared:
        assert torch.allclose(shared[name], whole[name], atol=1e-5, rtol=1e-4), name
        assert all(torch.equal(shared[name], again[name]) for again in repeats[1:]), name
