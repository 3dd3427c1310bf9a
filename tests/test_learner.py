"""The learner: losses move the policy the right way, and its weights reach a backend."""

from __future__ import annotations

import contextlib
import dataclasses
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from selfplay.backends import SamplingSettings
from selfplay.backends.hf_backend import HFBackend
from selfplay.config import LearnerConfig, LoraConfig
from selfplay.errors import UserError
from selfplay.games import make_env
from selfplay.learner import (
    REFERENCE_ADAPTER,
    TRAINED_ADAPTER,
    Learner,
    NonFiniteUpdate,
    Sample,
    scheduled_kl,
    scheduled_lr,
)
from selfplay.prompts import opening_messages, prompt_ids
from selfplay.reference_cache import ReferenceCache
from selfplay.scoring import response_logprobs


@pytest.fixture(scope="module")
def prompt(tiny_model_dir):
    from transformers import AutoTokenizer

    env = make_env("tictactoe")
    env.reset(seed=0)
    return prompt_ids(AutoTokenizer.from_pretrained(tiny_model_dir), opening_messages(env.observe("player_0")))


def sampled(learner, prompt, response, advantage, shift=0.0):
    """A sample whose sampler log-probs are the learner's own, shifted by `shift`."""
    with torch.no_grad():
        (logp,) = response_logprobs(learner.model, [prompt], [response])
    return Sample(tuple(prompt), tuple(response), tuple((logp + shift).tolist()), advantage)


def total_logprob(learner, prompt, response):
    with torch.no_grad():
        return response_logprobs(learner.model, [prompt], [response])[0].sum().item()


@pytest.mark.parametrize("loss", ["ppo", "reinforce"])
def test_positive_advantage_makes_a_response_likelier_and_negative_less(tiny_model_dir, prompt, loss):
    learner = Learner(str(tiny_model_dir), LearnerConfig(loss=loss, lr=1e-3), seed=0)
    good, bad = [11, 12, 13], [21, 22]
    before = total_logprob(learner, prompt, good), total_logprob(learner, prompt, bad)
    for _ in range(3):
        learner.update([sampled(learner, prompt, good, 1.0), sampled(learner, prompt, bad, -1.0)])
    after = total_logprob(learner, prompt, good), total_logprob(learner, prompt, bad)
    assert after[0] > before[0] + 0.1 and after[1] < before[1] - 0.1


def test_aggregations_scale_the_loss_as_documented(tiny_model_dir, prompt):
    response = [5, 6, 7, 8]
    losses = {}
    for aggregation in ("token_mean", "seq_mean_token_mean", "token_sum"):
        config = LearnerConfig(loss="reinforce", lr=0.0, aggregation=aggregation, token_sum_length=16)
        learner = Learner(str(tiny_model_dir), config, seed=0)
        samples = [sampled(learner, prompt, response, 1.0), sampled(learner, prompt, response[:2], 1.0)]
        losses[aggregation] = learner.update(samples)["loss"]
        logps = [sum(s.sampler_logprobs) for s in samples]
    assert losses["token_mean"] == pytest.approx(-(logps[0] + logps[1]) / 6, rel=1e-4)
    assert losses["seq_mean_token_mean"] == pytest.approx(-(logps[0] / 4 + logps[1] / 2) / 2, rel=1e-4)
    assert losses["token_sum"] == pytest.approx(-(logps[0] + logps[1]) / (16 * 2), rel=1e-4)


def test_importance_ratio_is_truncated_and_logged(tiny_model_dir, prompt):
    learner = Learner(str(tiny_model_dir), LearnerConfig(lr=0.0, importance_clip=2.0), seed=0)
    # The sampler gave each token a third of the learner's probability: ratio 3, clipped at 2.
    stats = learner.update([sampled(learner, prompt, [5, 6, 7], 1.0, shift=-math.log(3))])
    assert stats["ratio"] == pytest.approx(3.0, rel=1e-4)
    assert stats["ratio_max"] == pytest.approx(3.0, rel=1e-4)
    assert stats["ratio_clipped"] == 1.0
    clipped_loss = stats["loss"]
    unclipped = Learner(str(tiny_model_dir), LearnerConfig(lr=0.0, importance_clip=None), seed=0)
    stats = unclipped.update([sampled(unclipped, prompt, [5, 6, 7], 1.0, shift=-math.log(3))])
    assert stats["loss"] == pytest.approx(clipped_loss * 1.5, rel=1e-4)


def test_the_importance_ratio_is_logged_by_how_many_versions_old_a_sample_is(tiny_model_dir, prompt):
    learner = Learner(str(tiny_model_dir), LearnerConfig(lr=0.0, importance_clip=None), seed=0)
    on_policy = sampled(learner, prompt, [5, 6, 7], 1.0)
    # Sampled one version back with half the learner's probability per token, two back with double.
    one_back = dataclasses.replace(sampled(learner, prompt, [5, 6], 1.0, shift=-math.log(2)), lag=1)
    two_back = dataclasses.replace(sampled(learner, prompt, [8], 1.0, shift=math.log(2)), lag=2)
    stats = learner.update([on_policy, one_back, two_back])
    assert stats["ratio_lag0"] == pytest.approx(1.0, rel=1e-4)
    assert stats["ratio_lag1"] == pytest.approx(2.0, rel=1e-4)
    assert stats["ratio_lag2"] == pytest.approx(0.5, rel=1e-4)
    assert stats["ratio"] == pytest.approx((3 * 1.0 + 2 * 2.0 + 0.5) / 6, rel=1e-4)
    assert "ratio_lag0" not in learner.update([on_policy])  # on-policy only: nothing by lag


def test_kl_penalty_grows_as_the_policy_leaves_the_reference(tiny_model_dir, prompt):
    learner = Learner(str(tiny_model_dir), LearnerConfig(lr=1e-2, kl_coef=0.1), seed=0)
    first = learner.update([sampled(learner, prompt, [5, 6, 7], 1.0)])
    second = learner.update([sampled(learner, prompt, [5, 6, 7], 1.0)])
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)
    assert second["kl"] > 1e-4


def test_entropy_bonus_is_logged_and_raises_the_entropy(tiny_model_dir, prompt):
    from selfplay.scoring import response_logprobs_and_entropy

    response = [5, 6, 7]

    def entropy(learner):
        with torch.no_grad():
            logprobs, entropies = response_logprobs_and_entropy(learner.model, [prompt], [response])
        probs = torch.softmax(learner.model(torch.tensor([prompt + response[:-1]])).logits[0, -3:].float(), -1)
        assert torch.allclose(entropies[0], -(probs * probs.log()).sum(-1), atol=1e-4)
        assert torch.allclose(logprobs[0], probs.log()[range(3), response], atol=1e-4)
        return entropies[0].mean().item()

    first = None
    after = {}
    for coef in (0.0, 1.0):
        learner = Learner(str(tiny_model_dir), LearnerConfig(loss="reinforce", lr=1e-3, entropy_coef=coef), seed=0)
        before = entropy(learner)
        for _ in range(4):
            stats = learner.update([sampled(learner, prompt, response, 1.0)])
            first = first or stats
        after[coef] = entropy(learner)
    assert first["entropy"] == pytest.approx(before, rel=1e-4)
    # Reinforcing one response sharpens the policy; the bonus holds its entropy up.
    assert after[0.0] < before - 0.05
    assert after[1.0] > after[0.0] + 0.01


def test_a_moved_reference_is_the_policy_of_that_moment(tiny_model_dir, prompt, tmp_path):
    learner = Learner(str(tiny_model_dir), LearnerConfig(lr=1e-2, kl_coef=0.1), seed=0)
    learner.update([sampled(learner, prompt, [5, 6, 7], 1.0)])
    assert learner.update([sampled(learner, prompt, [5, 6, 7], 1.0)])["kl"] > 1e-4
    learner.move_reference()
    assert learner.update([sampled(learner, prompt, [5, 6, 7], 1.0)])["kl"] == pytest.approx(0.0, abs=1e-9)
    learner.save_training_state(tmp_path)
    restored = Learner(str(tiny_model_dir), LearnerConfig(lr=1e-2, kl_coef=0.1), seed=0)
    restored.load_training_state(tmp_path)
    assert restored.reference_moved
    for name, tensor in learner.reference.state_dict().items():
        assert torch.equal(restored.reference.state_dict()[name], tensor), name


def test_a_lora_learners_moving_reference_is_a_frozen_adapter_that_starts_at_the_base(tiny_model_dir, prompt, tmp_path):
    config = LearnerConfig(lr=1e-2, kl_coef=0.1, reference_update_every=1, lora=LoraConfig(rank=4, alpha=8))
    learner = Learner(str(tiny_model_dir), config, seed=0)
    drawn_after = torch.rand(4)
    fixed = Learner(str(tiny_model_dir), dataclasses.replace(config, reference_update_every=0), seed=0)
    assert torch.equal(torch.rand(4), drawn_after)  # the reference adapter drew none of the run's random numbers
    trainable = [name for name, p in learner.model.named_parameters() if p.requires_grad]
    assert trainable and all(f".{TRAINED_ADAPTER}." in name for name in trainable)
    assert sum(p.numel() for group in learner.optimizer.param_groups for p in group["params"]) == sum(
        learner.model.get_parameter(name).numel() for name in trainable
    )
    kls = {}
    for name, each in (("moving", learner), ("fixed", fixed)):  # both start at the base and leave it
        assert each.update([sampled(each, prompt, [5, 6, 7], 1.0)])["kl"] == pytest.approx(0.0, abs=1e-9)
        kls[name] = each.update([sampled(each, prompt, [5, 6, 7], 1.0)])["kl"]
    assert kls["moving"] == pytest.approx(kls["fixed"], rel=1e-5) and kls["moving"] > 1e-4
    learner.move_reference()
    own, reference = f".{TRAINED_ADAPTER}.", f".{REFERENCE_ADAPTER}."
    weights = dict(learner.model.named_parameters())
    moved = [name for name in weights if reference in name]
    assert moved and all(torch.equal(weights[name], weights[name.replace(reference, own)]) for name in moved)
    # The reference is now the policy; the fixed one is still the base.
    assert learner.update([sampled(learner, prompt, [5, 6, 7], 1.0)])["kl"] == pytest.approx(0.0, abs=1e-9)
    assert fixed.update([sampled(fixed, prompt, [5, 6, 7], 1.0)])["kl"] > 1e-4
    learner.save_training_state(tmp_path)
    restored = Learner(str(tiny_model_dir), config, seed=0)
    assert not restored.reference_moved
    restored.load_training_state(tmp_path)
    assert restored.reference_moved
    restored_weights = dict(restored.model.named_parameters())
    assert all(torch.equal(restored_weights[name], weights[name]) for name in moved)


@pytest.mark.parametrize("lora", [0, 4])
def test_a_reference_moved_at_a_rate_goes_that_fraction_of_the_way_to_the_policy(tiny_model_dir, prompt, lora):
    config = LearnerConfig(
        lr=1e-2, kl_coef=0.1, reference_update_every=1, reference_update_rate=0.25, lora=LoraConfig(rank=lora)
    )
    learner = Learner(str(tiny_model_dir), config, seed=0)
    for _ in range(2):
        learner.update([sampled(learner, prompt, [5, 6, 7], 1.0)])
        before = {name: t.clone() for name, t in learner._reference_weights().items()}
        policy = learner._policy_weights()
        learner.move_reference()
        after = learner._reference_weights()
        assert before.keys() == after.keys() and any(not torch.equal(before[k], after[k]) for k in after)
        assert all(torch.equal(after[k], before[k].lerp(policy[k], 0.25)) for k in after)


@pytest.mark.parametrize("lora", [0, 4])
def test_kept_weights_are_the_trained_weights_of_that_moment_restored_and_saved(tiny_model_dir, prompt, tmp_path, lora):
    config = LearnerConfig(lr=1e-2, kl_coef=0.1, lora=LoraConfig(rank=lora))
    learner = Learner(str(tiny_model_dir), config, seed=0)
    learner.update([sampled(learner, prompt, [5, 6, 7], 1.0)])
    learner.keep_weights()
    trained = {name for name, p in learner.model.named_parameters() if p.requires_grad}
    assert learner.kept.keys() == trained  # a LoRA learner's adapter alone
    then = {name: p.detach().clone() for name, p in learner.model.named_parameters()}
    learner.update([sampled(learner, prompt, [5, 6, 7], 1.0)])
    assert any(not torch.equal(p, then[name]) for name, p in learner.model.named_parameters())
    learner.save_training_state(tmp_path)
    learner.restore_kept_weights()
    assert all(torch.equal(p, then[name]) for name, p in learner.model.named_parameters())
    restored = Learner(str(tiny_model_dir), config, seed=0)
    restored.load_training_state(tmp_path)
    assert restored.kept.keys() == trained and all(torch.equal(restored.kept[k], then[k]) for k in trained)


def test_an_annealed_kl_penalty_falls_linearly_towards_zero_over_the_run(tiny_model_dir, prompt):
    annealed = LearnerConfig(lr=1e-3, kl_coef=0.5, kl_schedule="linear")
    assert [scheduled_kl(annealed, step, 4) for step in (1, 2, 3, 4)] == pytest.approx([0.5, 0.375, 0.25, 0.125])
    assert scheduled_kl(dataclasses.replace(annealed, kl_schedule="constant"), 4, 4) == 0.5
    learner = Learner(str(tiny_model_dir), annealed, seed=0)
    learner.update([sampled(learner, prompt, [5, 6, 7], 1.0)])  # the policy leaves its reference
    stats = learner.scheduled_update([sampled(learner, prompt, [5, 6, 7], 0.0)], 3, 4)
    # With no advantage the loss is the penalty alone, at step 3's coefficient.
    assert stats["kl_coef"] == 0.25 and stats["loss"] == pytest.approx(0.25 * stats["kl"], rel=1e-5)


def test_ppo_epochs_clip_the_ratio(tiny_model_dir, prompt):
    learner = Learner(str(tiny_model_dir), LearnerConfig(lr=5e-2, epochs=4, clip=0.2), seed=0)
    stats = learner.update([sampled(learner, prompt, [5, 6, 7], 1.0)])
    assert stats["clip_fraction"] > 0


@pytest.mark.parametrize("lora", [0, 4])
def test_ppo_ratios_are_exactly_one_at_learning_rate_zero_for_a_model_with_dropout(
    tiny_model_dir, prompt, tmp_path, lora
):
    # The sampler samples without dropout; the learner's passes (the log-probs before the update, each
    # epoch's loss) must score that same policy, or PPO clips on noise.
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attention_dropout=0.5)
    model.save_pretrained(tmp_path / "dropout")
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(tmp_path / "dropout")
    config = LearnerConfig(lr=0.0, epochs=2, minibatches=2, lora=LoraConfig(rank=lora))
    learner = Learner(str(tmp_path / "dropout"), config, seed=0)
    responses = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
    with torch.no_grad():
        sampler = response_logprobs(model.eval(), [prompt] * 3, responses)
    samples = [Sample(tuple(prompt), tuple(r), tuple(lp.tolist()), 1.0) for r, lp in zip(responses, sampler)]
    stats = learner.update(samples)
    assert stats["clip_fraction"] == 0.0
    assert stats["ratio_max"] == pytest.approx(1.0, abs=1e-5)


def test_exported_weights_reach_the_backend(tiny_model_dir, prompt, tmp_path):
    learner = Learner(str(tiny_model_dir), LearnerConfig(lr=1e-2), seed=0)
    backend = HFBackend(str(tiny_model_dir))
    greedy = SamplingSettings(max_new_tokens=6, temperature=0.0)
    before = backend.generate([prompt], greedy)[0]
    learner.update([sampled(learner, prompt, [5, 6, 7, 8, 9, 10], 1.0)])
    backend.load_weights(learner.export_weights(tmp_path / "policy.safetensors"), version=1)
    after = backend.generate([prompt], greedy)[0]
    assert after.policy_version == 1 and after.token_ids != before.token_ids
    with torch.no_grad():
        (expected,) = response_logprobs(learner.model, [prompt], [list(after.token_ids)])
    assert torch.allclose(torch.tensor(after.logprobs), expected, atol=1e-4)


def test_lora_trains_adapters_only_and_exports_merged_weights(tiny_model_dir, prompt, tmp_path):
    config = LearnerConfig(lr=1e-2, lora=LoraConfig(rank=4, alpha=8.0))
    learner = Learner(str(tiny_model_dir), config, seed=0)
    trainable = [n for n, p in learner.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    learner.update([sampled(learner, prompt, [5, 6, 7], 1.0)])
    learner.save_pretrained(tmp_path / "model")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert merged.state_dict().keys() == base.state_dict().keys()
    with torch.no_grad():
        ours = response_logprobs(learner.model, [prompt], [[5, 6, 7]])[0]
        theirs = response_logprobs(merged, [prompt], [[5, 6, 7]])[0]
        untouched = response_logprobs(base, [prompt], [[5, 6, 7]])[0]
    assert torch.allclose(ours, theirs, atol=1e-4)
    assert not torch.allclose(ours, untouched, atol=1e-4)
    resumed = Learner(str(tiny_model_dir), config, seed=0, resume_from=tmp_path / "model")
    with torch.no_grad():
        again = response_logprobs(resumed.model, [prompt], [[5, 6, 7]])[0]
    assert torch.allclose(ours, again, atol=1e-5)
    for other in (LoraConfig(rank=8, alpha=8.0), LoraConfig(rank=4, alpha=8.0, target_modules=["q_proj"])):
        with pytest.raises(UserError, match="does not fit the LoRA settings of this run"):
            Learner(str(tiny_model_dir), LearnerConfig(lr=1e-2, lora=other), seed=0, resume_from=tmp_path / "model")


def test_bf16_autocast_updates(tiny_model_dir, prompt):
    learner = Learner(str(tiny_model_dir), LearnerConfig(lr=1e-3, precision="bf16"), seed=0)
    stats = learner.update([sampled(learner, prompt, [5, 6, 7], 1.0)])
    assert math.isfinite(stats["loss"]) and stats["grad_norm"] > 0


def test_a_non_finite_gradient_is_refused_and_leaves_the_weights_as_they_were(tiny_model_dir, prompt):
    learner = Learner(str(tiny_model_dir), LearnerConfig(lr=1e-3), seed=0)
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    with pytest.raises(NonFiniteUpdate, match="loss nan, gradient norm nan: the update was not applied"):
        learner.update([sampled(learner, prompt, [5, 6, 7], math.nan)])
    assert all(torch.equal(before[k], v) for k, v in learner.model.state_dict().items())
    assert math.isfinite(learner.update([sampled(learner, prompt, [5, 6, 7], 1.0)])["loss"])


def test_an_update_that_makes_weights_non_finite_is_refused(tiny_model_dir, prompt):
    # The schema keeps learner.lr within [0, 1]; built directly, a learner takes any rate.
    learner = Learner(str(tiny_model_dir), LearnerConfig(lr=math.inf), seed=0)
    with pytest.raises(NonFiniteUpdate, match=r"made \d+ weight tensors infinite or NaN \(model\."):
        learner.update([sampled(learner, prompt, [5, 6, 7], 1.0)])


def test_lora_learners_share_one_frozen_base_and_generate_from_it(tiny_model_dir, prompt, tmp_path):
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    before = {name: tensor.clone() for name, tensor in base.state_dict().items()}
    config = LearnerConfig(lr=1e-2, lora=LoraConfig(rank=4, alpha=8.0))
    first, second = (Learner(str(tiny_model_dir), config, seed=s, shared_base=base) for s in (0, 1))
    embedding = base.get_input_embeddings().weight
    for learner in (first, second):  # the same tensors, not copies
        assert learner.model.get_base_model().get_input_embeddings().weight is embedding
    untrained = second.policy_state_dict()
    first.update([sampled(first, prompt, [5, 6, 7], 1.0)])
    assert all(torch.equal(before[name], tensor) for name, tensor in base.state_dict().items())
    assert all(torch.equal(untrained[name], tensor) for name, tensor in second.policy_state_dict().items())
    # A backend generating with the learner's own model samples what its exported weights sample.
    sampling = SamplingSettings(max_new_tokens=6, temperature=0.0)
    shared = HFBackend(str(tiny_model_dir), model=first.model)
    copied = HFBackend(str(tiny_model_dir))
    copied.load_weights(first.export_weights(tmp_path / "first.safetensors"), version=1)
    assert shared.generate([prompt], sampling)[0].token_ids == copied.generate([prompt], sampling)[0].token_ids
    assert first.model.training  # generating left the learner in training mode


@pytest.mark.parametrize(
    "schedule, warmup, expected",
    [
        ("constant", 0, [1.0, 1.0, 1.0, 1.0, 1.0]),
        ("linear", 0, [1.0, 0.8, 0.6, 0.4, 0.2]),
        ("linear", 1, [1.0, 1.0, 0.75, 0.5, 0.25]),
        (
            "cosine",
            0,
            [
                1.0,
                0.5 * (1 + math.cos(math.pi / 5)),
                0.5 * (1 + math.cos(2 * math.pi / 5)),
                0.5 * (1 + math.cos(3 * math.pi / 5)),
                0.5 * (1 + math.cos(4 * math.pi / 5)),
            ],
        ),
        ("constant", 2, [0.5, 1.0, 1.0, 1.0, 1.0]),
    ],
)
def test_learning_rate_schedules(schedule, warmup, expected):
    config = LearnerConfig(lr=2.0, lr_schedule=schedule, warmup_steps=warmup)
    assert [scheduled_lr(config, step, 5) for step in range(1, 6)] == pytest.approx([2.0 * e for e in expected])


def test_update_runs_at_the_given_learning_rate(tiny_model_dir, prompt):
    learner = Learner(tiny_model_dir, LearnerConfig(lr=1e-3))
    response = [5, 6, 7]
    assert learner.update([sampled(learner, prompt, response, 1.0)], lr=0.0)["lr"] == 0.0
    before = total_logprob(learner, prompt, response)
    learner.update([sampled(learner, prompt, response, 1.0)], lr=0.0)
    assert total_logprob(learner, prompt, response) == pytest.approx(before)  # lr 0 moves nothing
    assert learner.update([sampled(learner, prompt, response, 1.0)])["lr"] == 1e-3


def test_a_scheduled_update_takes_its_steps_rate_and_moves_the_reference_when_due(tiny_model_dir, prompt):
    config = LearnerConfig(lr=1e-2, lr_schedule="linear", warmup_steps=1, kl_coef=0.1, reference_update_every=2)
    learner = Learner(str(tiny_model_dir), config, seed=0)
    rates, moved = [], []
    for step in (1, 2, 3):
        rates.append(learner.scheduled_update([sampled(learner, prompt, [5, 6, 7], 1.0)], step, 3)["lr"])
        moved.append(learner.reference_moved)
    assert rates == pytest.approx([scheduled_lr(config, step, 3) for step in (1, 2, 3)]) and moved == [
        False,
        True,
        True,
    ]
    # The reference is the policy of step 2: step 3's update moved the policy on from it.
    assert any(not torch.equal(learner.reference.state_dict()[k], v) for k, v in learner.model.state_dict().items())


@pytest.mark.parametrize("loss", ["ppo", "reinforce"])
def test_copies_of_a_sequence_are_scored_once_and_each_counts(tiny_model_dir, prompt, loss):
    """Identical (prompt, response) samples share one forward pass, yet each keeps its own
    advantage and sampler log-probs: the gradient equals the loss written out sample by sample."""
    config = LearnerConfig(loss=loss, lr=1e-3, kl_coef=0.1, entropy_coef=0.01, importance_clip=1.5, max_grad_norm=1e9)
    learner = Learner(str(tiny_model_dir), config, seed=0)
    initial = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    learner.update([sampled(learner, prompt, [5, 6], 1.0)])  # the policy leaves its reference
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    model.load_state_dict(learner.model.state_dict())
    samples = [
        sampled(learner, prompt, [5, 6, 7], 1.0),
        sampled(learner, prompt, [5, 6, 7], -0.5, shift=-0.7),
        sampled(learner, prompt, [5, 6, 7], 2.0, shift=0.2),
        sampled(learner, prompt, [8], -1.0),
    ]
    stats = learner.update(samples)

    from selfplay.scoring import response_logprobs_and_entropy

    total_tokens = sum(len(s.response_ids) for s in samples)
    expected = 0.0
    for sample in samples:
        (logp,), (entropy,) = response_logprobs_and_entropy(model, [sample.prompt_ids], [sample.response_ids])
        with torch.no_grad():
            (reference,) = response_logprobs(initial, [sample.prompt_ids], [sample.response_ids])
        importance = torch.exp(logp.detach() - torch.tensor(sample.sampler_logprobs)).clamp(max=1.5)
        surrogate = torch.exp(logp - logp.detach()) * sample.advantage if loss == "ppo" else logp * sample.advantage
        log_ratio = reference - logp
        token_loss = -importance * surrogate - 0.01 * entropy + 0.1 * (torch.exp(log_ratio) - log_ratio - 1)
        expected = expected + token_loss.sum() / total_tokens
    expected.backward()
    assert stats["loss"] == pytest.approx(expected.item(), rel=1e-4)
    for (name, param), mine in zip(model.named_parameters(), learner.model.parameters()):
        assert torch.allclose(param.grad, mine.grad, rtol=1e-4, atol=1e-7), name


def test_activation_checkpointing_makes_the_same_update(tiny_model_dir, prompt):
    """Recomputing each layer's activations in the backward pass changes the memory an update
    takes, not the update (each row then runs whole, without a shared prefix's cache)."""
    updated, stats = {}, {}
    for checkpointing in (False, True):
        learner = Learner(str(tiny_model_dir), LearnerConfig(lr=1e-5, activation_checkpointing=checkpointing), seed=0)
        samples = [sampled(learner, prompt, [5, 6], 1.0), sampled(learner, prompt, [7], -1.0)]
        stats[checkpointing] = learner.update(samples)
        updated[checkpointing] = learner.backend_weights()
    assert stats[True] == pytest.approx(stats[False], rel=1e-5)
    # AdamW moves each weight by about lr: the sums' order may move one by a tenth of that.
    assert all(torch.allclose(updated[True][k], updated[False][k], atol=1e-6) for k in updated[False])


@pytest.mark.parametrize("lora", [0, 4], ids=["full", "lora"])
def test_the_reference_scores_each_turn_once_and_its_cache_survives_a_checkpoint(
    tiny_model_dir, prompt, tmp_path, lora
):
    config = LearnerConfig(lr=1e-2, kl_coef=0.1, lora=LoraConfig(rank=lora))
    learner = Learner(str(tiny_model_dir), config, seed=0)
    scored = []
    logprobs = learner._logprobs

    def counted(samples, grad, model=None):
        scored.append(len(samples))
        return logprobs(samples, grad, model)

    learner._logprobs = counted
    a, b, c = (sampled(learner, prompt, response, 1.0) for response in ([5, 6, 7], [8, 9], [10]))
    learner.update([a, b, b])
    learner.update([b, c, a])
    assert scored == [2, 1], "each distinct turn once, and in a later update only the turn not seen before"
    with torch.no_grad(), learner.model.disable_adapter() if lora else contextlib.nullcontext():
        model = learner.model if lora else learner.reference
        direct = response_logprobs(model, [prompt] * 3, [[5, 6, 7], [8, 9], [10]])
    assert all(
        torch.allclose(cached, fresh, atol=1e-6)
        for cached, fresh in zip(learner._reference_logprobs([a, b, c]), direct)
    )

    learner.save_training_state(tmp_path)
    restored = Learner(str(tiny_model_dir), config, seed=0)
    restored.load_training_state(tmp_path)
    assert list(restored.reference_cache.entries) == list(learner.reference_cache.entries)
    for key, value in learner.reference_cache.entries.items():
        assert torch.equal(restored.reference_cache.entries[key], value)


def test_the_reference_cache_forgets_the_least_recently_used_turn_first():
    cache = ReferenceCache(capacity=2)
    cache.add({"a": torch.tensor([1.0]), "b": torch.tensor([2.0])})
    assert set(cache.found(["a", "z"])) == {"a"}
    cache.add({"c": torch.tensor([3.0])})
    assert list(cache.entries) == ["a", "c"]
