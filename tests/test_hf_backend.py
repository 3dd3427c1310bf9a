import re
import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM

from selfplay.backends import SamplingSettings, make_backend, save_weights
from selfplay.backends.hf_backend import MIN_SHARED_PREFIX, HFBackend, prefix_batches
from selfplay.games import make_env
from selfplay.prompts import opening_messages, prompt_ids


def game_prompts(tokenizer, games=("tictactoe", "kuhn_poker", "negotiation", "nim")):
    prompts = []
    for game in games:
        env = make_env(game)
        env.reset(seed=0)
        prompts.append(prompt_ids(tokenizer, opening_messages(env.observe(env.agent_selection))))
    return prompts


def nucleus_logprobs(logprobs: torch.Tensor, top_p: float) -> torch.Tensor:
    """`logprobs` (..., vocab) cut to the top-p nucleus, the most likely tokens until their mass
    reaches top_p, and renormalised over it; the rest -inf."""
    probs, order = logprobs.exp().sort(-1, descending=True)
    in_nucleus = torch.zeros_like(logprobs, dtype=torch.bool).scatter(-1, order, probs.cumsum(-1) - probs < top_p)
    return torch.log_softmax(logprobs.masked_fill(~in_nucleus, float("-inf")), -1)


def recomputed_logprobs(model, prompt, response, temperature, top_p=1.0):
    """Each response token's log-probability under softmax(logits / T), renormalised over the
    top-p nucleus when top_p < 1."""
    ids = torch.tensor([prompt + list(response)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    logprobs = torch.log_softmax(logits, -1)
    if top_p < 1.0:
        logprobs = nucleus_logprobs(logprobs, top_p)
    return logprobs.gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)


def test_generations_are_well_formed_seeded_and_match_recomputed_logprobs(tiny_model_dir):
    backend = HFBackend(str(tiny_model_dir), max_batch_size=3)  # two chunks: sorting and reordering
    prompts = game_prompts(backend.tokenizer)
    sampling = SamplingSettings(max_new_tokens=12, temperature=0.7, seed=3)
    generations = backend.generate(prompts, sampling)
    assert len(generations) == len(prompts)
    for generation in generations:
        assert len(generation.token_ids) == len(generation.logprobs) <= 12
        assert generation.finish_reason in ("stop", "length")
        body = generation.token_ids[:-1] if generation.finish_reason == "stop" else generation.token_ids
        assert generation.text == backend.tokenizer.decode(body)
        assert generation.policy_version == 0
    assert backend.generate(prompts, sampling) == generations
    assert backend.generate(prompts, SamplingSettings(max_new_tokens=12, temperature=0.7, seed=4)) != generations
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    for prompt, generation in zip(prompts, generations):
        expected = recomputed_logprobs(reference, prompt, generation.token_ids, 0.7)
        assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=1e-4)


@pytest.mark.parametrize("temperature, top_p", [(0.7, 0.8), (1.3, 0.5)])
def test_top_p_logprobs_are_of_the_renormalised_nucleus_sampled_from(tiny_model_dir, hf_model, temperature, top_p):
    """The learner's behaviour policy is the distribution each token was drawn from: under top_p
    that is softmax(logits / T) cut to the nucleus and renormalised, -log(nucleus mass) above
    the full distribution's log-probability (about -log(top_p) for the untrained model)."""
    backend = HFBackend(str(tiny_model_dir))
    prompts = game_prompts(backend.tokenizer)
    sampling = SamplingSettings(max_new_tokens=12, temperature=temperature, top_p=top_p, seed=3)
    for prompt, generation in zip(prompts, backend.generate(prompts, sampling)):
        logprobs = torch.tensor(generation.logprobs)
        assert torch.isfinite(logprobs).all()
        expected = recomputed_logprobs(hf_model, prompt, generation.token_ids, temperature, top_p)
        assert torch.allclose(logprobs, expected, atol=1e-4)
        untruncated = recomputed_logprobs(hf_model, prompt, generation.token_ids, temperature)
        assert (logprobs - untruncated).min() > 0.1


def test_generation_does_not_touch_the_callers_random_state(tiny_model_dir):
    backend = HFBackend(str(tiny_model_dir))
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    backend.generate(game_prompts(backend.tokenizer)[:1], SamplingSettings(max_new_tokens=4, seed=9))
    assert torch.equal(torch.rand(3), expected)


def test_loading_weights_changes_the_policy_and_its_version(tiny_model_dir, tmp_path):
    backend = HFBackend(str(tiny_model_dir))
    prompts = game_prompts(backend.tokenizer)
    greedy = SamplingSettings(max_new_tokens=8, temperature=0)
    before = backend.generate(prompts, greedy)
    changed = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in changed.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.5)
    backend.load_weights(save_weights(changed, tmp_path / "weights.safetensors"), version=3)
    after = backend.generate(prompts, greedy)
    assert [g.token_ids for g in after] != [g.token_ids for g in before]
    assert all(g.policy_version == 3 for g in after)
    for prompt, generation in zip(prompts, after):
        step = changed(torch.tensor([prompt])).logits[0, -1]
        assert generation.token_ids[0] == int(step.argmax())


@pytest.mark.slow
def test_a_bf16_backend_holds_bf16_weights_and_casts_fp32_updates(tiny_model_dir, tmp_path):
    backend = make_backend("hf", str(tiny_model_dir), "bf16")
    assert {p.dtype for p in backend.model.parameters()} == {torch.bfloat16}
    changed = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in changed.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.5)
    backend.load_weights(save_weights(changed, tmp_path / "weights.safetensors"), version=1)
    served = backend.model.state_dict()
    for name, weight in changed.state_dict().items():
        assert torch.equal(served[name], weight.to(torch.bfloat16)), name
    prompts = game_prompts(backend.tokenizer)
    sampled = backend.generate(prompts, SamplingSettings(max_new_tokens=6, seed=0))
    # Sampling (batched, padded, cached) and one plain forward round differently in bf16: with
    # these perturbed weights the logits reach the tens, where bf16's 8-bit mantissa steps by
    # 0.06 to 0.125, and the two have differed by up to 0.12 (the tiny model's tokenizer, and so
    # these numbers, change with the games' texts). Under the replaced weights they differ by
    # several nats.
    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    for prompt, generation in zip(prompts, sampled):
        assert generation.token_ids and generation.policy_version == 1
        logprobs = torch.tensor(generation.logprobs)
        assert torch.allclose(
            logprobs, recomputed_logprobs(backend.model, prompt, generation.token_ids, 1.0), atol=0.25
        )
        assert (logprobs - recomputed_logprobs(original, prompt, generation.token_ids, 1.0)).abs().max() > 0.5


def test_prompts_sharing_a_prefix_batch_together_and_the_rest_batch_apart():
    rules_a, rules_b = list(range(100, 100 + MIN_SHARED_PREFIX)), list(range(200, 200 + MIN_SHARED_PREFIX))
    prompts = [
        rules_a + [1, 2, 3],
        [7, 1],  # shares nothing
        rules_b + [5],
        rules_a + [4],
        [9, 9, 9],  # shares nothing
        rules_b + [6, 6],
        rules_a + [1, 2],
    ]
    batches = prefix_batches(prompts, max_size=2)
    assert sorted(i for batch in batches for i in batch) == list(range(len(prompts)))
    # each by length; game a's three split at two, and its odd one out batches with the prompts alone
    assert batches == [[6, 0], [2, 5], [1, 4], [3]]
    assert prefix_batches(prompts, max_size=8) == [[3, 6, 0], [2, 5], [1, 4]]


def test_a_batch_sharing_its_rules_samples_as_each_prompt_alone(tiny_model_dir):
    backend = HFBackend(str(tiny_model_dir))
    env = make_env("tictactoe")
    prompts = []
    for seed in range(6):
        env.reset(seed=seed)
        for move in env.legal_moves()[: seed % 3]:
            env.step(env.answer(move))
        prompts.append(prompt_ids(backend.tokenizer, opening_messages(env.observe(env.agent_selection))))
    assert len({tuple(p) for p in prompts}) > 1
    greedy = SamplingSettings(max_new_tokens=8, temperature=0)
    together = backend.generate(prompts, greedy)
    alone = [backend.generate([prompt], greedy)[0] for prompt in prompts]
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    for a, b in zip(together, alone):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


def test_sampling_over_a_shared_prefix_uses_no_deprecated_transformers_api(tiny_model_dir):
    """The prefix's cache handed to `generate` is the kind the installed transformers wants: no
    FutureWarning or DeprecationWarning reaches the command line."""
    backend = HFBackend(str(tiny_model_dir))
    prefix = list(range(5, 5 + MIN_SHARED_PREFIX))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backend.generate([prefix + [40 + i] for i in range(3)], SamplingSettings(max_new_tokens=4, seed=0))
    assert [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))] == []


def learner_weights(model_dir, seed: int = 1) -> dict[str, torch.Tensor]:
    """Perturbed weights of the model, named as a learner streams them: tied embeddings once."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.5)
    weights = model.state_dict()
    assert model.config.tie_word_embeddings
    del weights["lm_head.weight"]
    return weights


def test_a_weights_stream_serves_what_the_same_weights_by_file_serve(tiny_model_dir, tmp_path):
    weights = learner_weights(tiny_model_dir)
    by_file, by_stream = HFBackend(str(tiny_model_dir)), HFBackend(str(tiny_model_dir))
    by_file.load_weights(save_weights(weights, tmp_path / "weights.safetensors"), version=2)
    by_stream.load_state(iter(weights.items()), version=2)  # read once, as a sharded learner streams
    prompts = game_prompts(by_stream.tokenizer)
    sampling = SamplingSettings(max_new_tokens=12, temperature=1.0, seed=5)
    assert by_stream.generate(prompts, sampling) == by_file.generate(prompts, sampling)
    assert torch.equal(by_stream.model.lm_head.weight, weights["model.embed_tokens.weight"])  # tied
    # A bf16 backend takes the float32 stream rounded.
    rounded = make_backend("hf", str(tiny_model_dir), "bf16")
    rounded.load_state(weights, version=2)
    for name, weight in weights.items():
        assert torch.equal(rounded.model.state_dict()[name], weight.to(torch.bfloat16)), name


def test_a_stream_with_a_tensor_missing_unknown_misshapen_or_twice_is_refused_and_the_old_weights_serve(tiny_model_dir):
    backend = HFBackend(str(tiny_model_dir))
    backend.load_state(learner_weights(tiny_model_dir, seed=1), version=1)
    serving = {name: tensor.clone() for name, tensor in backend.model.state_dict().items()}
    prompts = game_prompts(backend.tokenizer)
    sampling = SamplingSettings(max_new_tokens=8, seed=2)
    before = backend.generate(prompts, sampling)

    new = list(learner_weights(tiny_model_dir, seed=2).items())
    middle = len(new) // 2  # the tensors before it would be in place already if copied as they come
    name, tensor = new[middle]
    faults = {
        "without": (new[:middle] + new[middle + 1 :], rf"ended without 1 of the model's tensors: {re.escape(name)}\."),
        "unknown": (new[:middle] + [("model.extra.weight", tensor)] + new[middle:], r"'model.extra.weight', a tensor"),
        "misshapen": (
            new[:middle] + [(name, tensor[..., :-1])] + new[middle + 1 :],
            rf"'{name}' the shape \(.*\); the model's is {re.escape(str(tuple(tensor.shape)))}",
        ),
        "tied twice": (
            new + [("lm_head.weight", new[0][1])],
            r"'lm_head.weight' twice \(as 'model.embed_tokens.weight'",
        ),
    }
    for fault, (stream, message) in faults.items():
        with pytest.raises(ValueError, match=message):
            backend.load_state(iter(stream), version=2)
        assert backend.version == 1, fault
        for key, value in backend.model.state_dict().items():
            assert torch.equal(value, serving[key]), (fault, key)
    assert backend.generate(prompts, sampling) == before


def test_a_backend_sharing_the_learners_model_reads_the_stream_through_and_takes_its_version(tiny_model_dir, hf_model):
    backend = HFBackend(str(tiny_model_dir), model=hf_model)
    weights = learner_weights(tiny_model_dir)
    stream = iter(weights.items())
    backend.load_state(stream, version=4)
    assert next(stream, None) is None  # a sharded learner's ranks all step through to the end
    assert backend.version == 4
    assert not torch.equal(hf_model.model.embed_tokens.weight, weights["model.embed_tokens.weight"])
