"""Legal decoding: the tree of legal answers, masked scoring, the transformers sampler, the
rollout engine and the learner on its samples."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from selfplay.backends import SamplingSettings, hf_backend, make_backend, save_weights
from selfplay.config import LearnerConfig, load_config
from selfplay.errors import UserError
from selfplay.evaluation.exploitability import information_states, move_probabilities
from selfplay.games import make_env
from selfplay.learner import Learner, Sample
from selfplay.legal_decoding import advance_forced, allowed_mask, allowed_tokens, answer_choices
from selfplay.prompts import opening_messages, prompt_ids
from selfplay.rollouts import MatchSpec, RolloutEngine, RolloutSettings
from selfplay.scoring import response_hidden, response_logprobs, response_logprobs_and_entropy, vocab_size
from selfplay.train import validate
from tests.fakes import CountingTokenizer

TREE = ((1, 2, 9), (1, 3, 9), (4, 9))
LEGAL = SamplingSettings(max_new_tokens=12, seed=3, decoding="legal")


def legal_mask(model, responses, choices):
    return allowed_mask(responses, choices, vocab_size(model))


def legal_logprobs(model, prompts, responses, choices):
    """Each response's log-probabilities as legal decoding gives them, at temperature 1."""
    return response_logprobs(model, prompts, responses, 1.0, legal_mask(model, responses, choices))


def turns_with_choices(tokenizer, games=("tictactoe", "kuhn_poker", "connect_four"), per_game=3):
    """(prompt ids, choices, legal answers) at a few states of random games."""
    out = []
    cache: dict = {}
    for name in games:
        env = make_env(name)
        rng = random.Random(0)
        for episode in range(per_game):
            env.reset(seed=episode)
            for _ in range(episode):
                env.step(env.answer(rng.choice(env.legal_moves())))
                if env.end_reason is not None:
                    env.reset(seed=episode)
            answers = [env.answer(move) for move in env.legal_moves()]
            prompt = prompt_ids(tokenizer, opening_messages(env.observe(env.agent_selection)))
            out.append((prompt, answer_choices(answers, tokenizer, tokenizer.eos_token_id, cache), answers))
    return out


def test_allowed_tokens_follow_the_tree_of_legal_answers():
    assert allowed_tokens(TREE, ()) == (1, 4)
    assert allowed_tokens(TREE, (1,)) == (2, 3)
    assert allowed_tokens(TREE, (1, 3)) == (9,)
    assert allowed_tokens(TREE, (1, 3, 9)) == ()  # a whole answer
    assert allowed_tokens(TREE, (5,)) == ()  # off the tree


def test_forced_tokens_are_written_at_probability_one_until_a_choice_waits():
    responses, logprobs = [[], [4], [1, 2, 9]], [[], [-0.3], [0.0, -1.0, 0.0]]
    waiting, allowed = advance_forced(responses, logprobs, [TREE] * 3)
    assert (waiting, allowed) == ([0], [(1, 4)])
    assert responses[1:] == [[4, 9], [1, 2, 9]] and logprobs[1] == [-0.3, 0.0]
    responses[0].append(1)
    logprobs[0].append(-0.7)
    assert advance_forced(responses, logprobs, [TREE] * 3) == ([0], [(2, 3)])
    responses[0].append(3)
    logprobs[0].append(-0.1)
    assert advance_forced(responses, logprobs, [TREE] * 3) == ([], [])
    assert responses[0] == [1, 3, 9] and logprobs[0] == [-0.7, -0.1, 0.0]


def test_answer_choices_end_with_end_of_turn_once_each_and_tokenize_each_answer_once(tokenizer):
    counting = CountingTokenizer(tokenizer)
    cache: dict = {}
    eos = tokenizer.eos_token_id
    choices = answer_choices(["\\boxed{4}", "\\boxed{0}", "\\boxed{4}"], counting, eos, cache)
    four, zero = (tokenizer(f"\\boxed{{{d}}}", add_special_tokens=False)["input_ids"] + [eos] for d in (4, 0))
    assert choices == (tuple(four), tuple(zero))
    assert answer_choices(["\\boxed{0}"], counting, eos, cache) == (tuple(zero),)
    assert counting.calls == 1


def test_masked_scoring_is_the_softmax_over_the_allowed_tokens(hf_model, tokenizer):
    prompt, choices, _ = turns_with_choices(tokenizer, games=("tictactoe",), per_game=1)[0]
    response = choices[3]
    (legal, free), (legal_entropy, free_entropy) = response_logprobs_and_entropy(
        hf_model, [prompt, prompt], [response, response], 1.0, legal_mask(hf_model, [response, response], [choices, ()])
    )
    with torch.no_grad():
        logits = hf_model(torch.tensor([[*prompt, *response]])).logits[0, len(prompt) - 1 : -1].float()
    for j, token in enumerate(response):
        allowed = list(allowed_tokens(choices, response[:j]))
        expected = torch.log_softmax(logits[j, allowed], dim=-1)
        assert legal[j].item() == pytest.approx(expected[allowed.index(token)].item(), abs=1e-5)
        assert legal_entropy[j].item() == pytest.approx(-(expected.exp() * expected).sum().item(), abs=1e-5)
        assert free[j].item() == pytest.approx(torch.log_softmax(logits[j], -1)[token].item(), abs=1e-5)
    branching = [j for j in range(len(response)) if len(allowed_tokens(choices, response[:j])) > 1]
    assert branching == [3]  # TicTacToe's answers part only at the cell's digit
    assert all(legal[j].item() == 0.0 for j in range(len(response)) if j not in branching)
    assert free_entropy.min().item() > 0


@pytest.mark.slow
def test_legal_sampling_writes_a_choice_drawn_from_the_masked_probabilities(tiny_model_dir, hf_model, tokenizer):
    backend = make_backend("hf", str(tiny_model_dir))
    turns = turns_with_choices(tokenizer)
    prompts, choices = [t[0] for t in turns], [t[1] for t in turns]
    generations = backend.generate(prompts, LEGAL, choices)
    scored = legal_logprobs(hf_model, prompts, [g.token_ids for g in generations], choices)
    for generation, options, (_, _, answers), logp in zip(generations, choices, turns, scored):
        assert generation.token_ids in options and generation.finish_reason == "stop"
        assert generation.text in answers
        assert generation.logprobs == pytest.approx(logp.tolist(), abs=1e-5)
    assert backend.generate(prompts, LEGAL, choices) == generations

    # One prompt many times: the answers' frequencies follow their masked probabilities.
    many = 600
    drawn = Counter(g.token_ids for g in backend.generate([prompts[0]] * many, LEGAL, [choices[0]] * many))
    probs = legal_logprobs(hf_model, [prompts[0]] * len(choices[0]), list(choices[0]), [choices[0]] * len(choices[0]))
    for option, logp in zip(choices[0], probs):
        p = logp.sum().exp().item()
        assert abs(drawn[option] / many - p) < 4 * (p * (1 - p) / many) ** 0.5 + 1e-3

    greedy = backend.generate(prompts, SamplingSettings(temperature=0, decoding="legal"), choices)
    for generation, options, prompt in zip(greedy, choices, prompts):
        best = max(options, key=lambda o: legal_logprobs(hf_model, [prompt], [o], [options])[0].sum().item())
        assert generation.token_ids == best


def batch_sizes_run(monkeypatch) -> list[int]:
    """The number of contexts in each call the transformers sampler makes to the model, as it runs."""
    sizes = []

    def counting_hidden(model, contexts, responses):
        sizes.append(len(contexts))
        return response_hidden(model, contexts, responses)

    monkeypatch.setattr(hf_backend, "response_hidden", counting_hidden)
    return sizes


def test_legal_sampling_runs_each_distinct_context_once(tiny_model_dir, hf_model, tokenizer, monkeypatch):
    backend = make_backend("hf", str(tiny_model_dir))
    turns = turns_with_choices(tokenizer, games=("kuhn_poker", "tictactoe"), per_game=2)
    prompts, choices = [t[0] for t in turns] * 4, [t[1] for t in turns] * 4
    contexts_run = batch_sizes_run(monkeypatch)
    generations = backend.generate(prompts, LEGAL, choices)
    assert contexts_run[0] == len({tuple(p) for p in prompts}) < len(prompts)
    scored = legal_logprobs(hf_model, prompts, [g.token_ids for g in generations], choices)
    for generation, options, logp in zip(generations, choices, scored):
        assert generation.token_ids in options
        assert generation.logprobs == pytest.approx(logp.tolist(), abs=1e-5)


def test_a_frozen_backend_runs_each_context_once_alone_and_forgets_on_new_weights(
    tiny_model_dir, hf_model, tokenizer, monkeypatch, tmp_path
):
    frozen = make_backend("hf", str(tiny_model_dir), frozen=True)
    turns = turns_with_choices(tokenizer, games=("kuhn_poker", "tictactoe"), per_game=2)
    prompts, choices = [t[0] for t in turns], [t[1] for t in turns]
    batches_run = batch_sizes_run(monkeypatch)
    generations = frozen.generate(prompts, LEGAL, choices)
    contexts = len(batches_run)
    assert set(batches_run) == {1} and contexts >= len({tuple(p) for p in prompts})
    scored = legal_logprobs(hf_model, prompts, [g.token_ids for g in generations], choices)
    for generation, logp in zip(generations, scored):
        assert generation.logprobs == pytest.approx(logp.tolist(), abs=1e-5)
    # The same states again: nothing runs, and the seeded draws are those of the first time;
    # nor in another order.
    assert frozen.generate(prompts, LEGAL, choices) == generations
    reordered = frozen.generate(prompts[::-1], LEGAL, choices[::-1])
    assert len(batches_run) == contexts and all(g.token_ids in c for g, c in zip(reordered, choices[::-1]))
    # New weights: every context runs again.
    frozen.load_weights(save_weights(hf_model, tmp_path / "weights.safetensors"), version=1)
    frozen.generate(prompts, LEGAL, choices)
    assert len(batches_run) == 2 * contexts


@pytest.mark.slow
def test_rollouts_under_legal_decoding_play_no_invalid_move(tiny_model_dir, tokenizer):
    backend = make_backend("hf", str(tiny_model_dir))
    games = ("tictactoe", "kuhn_poker", "connect_four", "nim")
    matches = [MatchSpec(games[i % 4], ("policy", "random") if i % 2 else ("random", "policy"), i) for i in range(12)]
    settings = RolloutSettings(sampling=LEGAL)
    trajectories = list(RolloutEngine({"policy": backend, "random": "random"}, settings).run(matches))
    turns = [turn for t in trajectories for turn in t.turns]
    assert len(turns) >= 24
    assert all(t.result.end_reason == "game_over" and sum(t.result.invalid_moves) == 0 for t in trajectories)
    for turn in turns:
        assert not turn.invalid and turn.response_ids in turn.choices
        assert all(tokenizer.decode(c[:-1]).startswith("\\boxed{") for c in turn.choices)
    # The untrained model names an illegal move in most of these turns when sampling freely.
    free = RolloutSettings(sampling=SamplingSettings(max_new_tokens=12, seed=3))
    freely = list(RolloutEngine({"policy": backend, "random": "random"}, free).run(matches))
    assert sum(sum(t.result.invalid_moves) for t in freely) >= 6

    seats = len(make_env("proposer_solver").possible_agents)
    free_text = [MatchSpec("proposer_solver", ("policy",) * seats, 0)]
    with pytest.raises(UserError, match="'proposer_solver' takes free text"):
        list(RolloutEngine({"policy": backend}, settings).run(free_text))


def test_the_learner_scores_legal_samples_as_the_sampler_did_and_learns_among_legal_answers(tiny_model_dir, tokenizer):
    backend = make_backend("hf", str(tiny_model_dir))
    turns = turns_with_choices(tokenizer, games=("tictactoe",), per_game=3)
    prompts, choices = [t[0] for t in turns], [t[1] for t in turns]
    generations = backend.generate(prompts, LEGAL, choices)
    learner = Learner(str(tiny_model_dir), LearnerConfig(lr=1e-2, kl_coef=0.1), seed=0)

    def samples(masked: bool) -> list[Sample]:
        return [
            Sample(tuple(p), g.token_ids, g.logprobs, 1.0, c if masked else ())
            for p, g, c in zip(prompts, generations, choices)
        ]

    stats = learner.update(samples(masked=True))
    # The learner's masked log-probs are the sampler's: an importance ratio of 1 before the step.
    assert stats["ratio"] == pytest.approx(1.0, abs=1e-4) and stats["ratio_max"] == pytest.approx(1.0, abs=1e-4)
    assert stats["kl"] == pytest.approx(0.0, abs=1e-6)

    # A positive advantage raises the chosen answer's probability among the legal ones (one sample
    # per update: a step on several similar prompts may trade one's probability for another's).
    def legal_probability(model, i: int) -> float:
        (logp,) = legal_logprobs(model, [prompts[i]], [generations[i].token_ids], [choices[i]])
        return logp.sum().exp().item()

    for i, sample in enumerate(samples(masked=True)):
        alone = Learner(str(tiny_model_dir), LearnerConfig(lr=1e-3), seed=0)
        before = legal_probability(alone.model, i)
        alone.update([sample])
        assert legal_probability(alone.model, i) > before
    # Read unmasked, the same samples would look off-policy.
    assert learner.update(samples(masked=False))["ratio"] < 0.5


def test_legal_decoding_is_refused_for_free_text_games_and_with_top_p(tiny_model_dir):
    base = [f"model={tiny_model_dir}", "rollout.decoding=legal"]
    validate(load_config(None, [*base, "games={tictactoe: 1, negotiation: 1}"]))
    with pytest.raises(UserError, match="proposer_solver take free text"):
        validate(load_config(None, [*base, "games={tictactoe: 1, proposer_solver: 1}"]))
    with pytest.raises(UserError, match="rollout.top_p"):
        validate(load_config(None, [*base, "games={tictactoe: 1}", "rollout.top_p=0.9"]))
    with pytest.raises(UserError, match="rollout.decoding"):
        load_config(None, ["rollout.decoding=masked"])


def test_the_exploitability_probe_reads_the_policy_legal_decoding_samples(hf_model, tokenizer):
    free = move_probabilities(hf_model, tokenizer, "kuhn_poker")
    legal = move_probabilities(hf_model, tokenizer, "kuhn_poker", RolloutSettings(LEGAL))
    assert set(legal) == set(free) and len(legal) == 12
    assert all(sum(actions.values()) == pytest.approx(1.0) for actions in legal.values())
    state = information_states("kuhn_poker")[5]
    choices = answer_choices(state.answers, tokenizer, tokenizer.eos_token_id, {})
    prompt = prompt_ids(tokenizer, state.messages)
    scored = legal_logprobs(hf_model, [prompt] * len(choices), list(choices), [choices] * len(choices))
    for action, logp in zip(state.actions, scored):
        assert legal[state.key][action] == pytest.approx(logp.sum().exp().item(), abs=1e-6)
    assert max(abs(legal[k][a] - free[k][a]) for k in legal for a in legal[k]) > 1e-3
