"""Structured decoding: answer grammars, xgrammar's masks, the transformers sampler, the rollout
engine and the learner replaying the masks over its samples (the built-in model's tokenizer; the
real model and vLLM are in test_real_model.py)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch

from selfplay.backends import SamplingSettings, make_backend
from selfplay.config import LearnerConfig, load_config
from selfplay.errors import UserError
from selfplay.evaluation.exploitability import move_probabilities
from selfplay.games import make_env, make_game
from selfplay.games.answers import BOXED, AnswerFormat, AnswerGrammar
from selfplay.learner import Learner, Sample
from selfplay.prompts import opening_messages, prompt_ids
from selfplay.rollouts import MatchSpec, RolloutEngine, RolloutSettings
from selfplay.structured_decoding import grammar_text, unpacked_bitmask
from selfplay.train import validate

# At most a token a character and the end of the turn: 28 and 14 tokens at most.
MESSAGE = AnswerGrammar.around(AnswerFormat("<answer>", "</answer>"), "[^<>]{1,10}")
NUMBER = AnswerGrammar.around(BOXED, "-?[0-9]{1,3}")
STRUCTURED = SamplingSettings(max_new_tokens=28, temperature=1.0, seed=5, decoding="structured")


def prompts(tokenizer, count: int) -> list[list[int]]:
    env = make_env("kuhn_poker")
    env.reset(seed=0)
    base = prompt_ids(tokenizer, opening_messages(env.observe(env.agent_selection), "full"))
    return [base[: len(base) - i] for i in range(count)]  # differing tails after a shared prefix


def test_an_answer_grammar_is_a_regex_or_ebnf_and_one_of_moves_reads_as_the_game_writes_them():
    with pytest.raises(ValueError, match="exactly one"):
        AnswerGrammar()
    with pytest.raises(ValueError, match="exactly one"):
        AnswerGrammar(regex="a", ebnf='root ::= "a"')
    moves = AnswerGrammar.one_of(BOXED, ["bet", "check", "x(0,2)"])
    assert [bool(re.fullmatch(moves.regex, BOXED.wrap(m))) for m in ("bet", "check", "x(0,2)", "call")] == [
        True,
        True,
        True,
        False,
    ]
    assert "root ::=" in grammar_text(moves) and grammar_text(AnswerGrammar(ebnf='root ::= "yes" | "no"'))


def test_the_unpacked_bitmask_masks_what_xgrammar_masks(grammars):
    import xgrammar

    matcher = grammars.matcher(grammar_text(NUMBER))
    packed = grammars.bitmask(1)
    matcher.fill_next_token_bitmask(packed, 0)
    logits = torch.zeros(1, grammars.vocab_size)
    xgrammar.apply_token_bitmask_inplace(logits, packed)
    allowed = unpacked_bitmask(packed, grammars.vocab_size)
    assert torch.equal(allowed, logits.isfinite())
    assert 0 < allowed.sum() < grammars.vocab_size / 10  # only tokens that begin "\boxed{"


def test_the_mask_replayed_over_a_response_allows_its_tokens_and_rejects_one_outside_the_grammar(grammars, tokenizer):
    answer = tokenizer("\\boxed{-12}", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    free = [5, 6, 7]
    mask = grammars.mask([answer, free], [grammar_text(NUMBER), ""])
    assert mask.shape == (len(answer) + len(free), grammars.vocab_size)
    assert all(mask[j, token] for j, token in enumerate(answer))
    assert mask[len(answer) - 1].sum() == 1  # after the closing brace, only the end of the answer
    assert mask[len(answer) :].all()  # a freely sampled response: every token allowed
    letters = tokenizer("\\boxed{ab}", add_special_tokens=False)["input_ids"]
    with pytest.raises(ValueError, match="breaks its grammar"):
        grammars.mask([letters], [grammar_text(NUMBER)])


def test_structured_sampling_keeps_to_each_grammar_with_the_logprobs_the_learner_replays(tiny_model_dir, tokenizer):
    backend = make_backend("hf", str(tiny_model_dir))
    forms = [MESSAGE, NUMBER] * 4
    texts = [grammar_text(form) for form in forms]
    batch = prompts(tokenizer, len(forms))
    generations = backend.generate(batch, STRUCTURED, None, texts)
    assert all(g.finish_reason == "stop" and re.fullmatch(f.regex, g.text) for g, f in zip(generations, forms))
    assert len({g.text for g in generations}) > 4  # the content is sampled, not fixed
    assert backend.generate(batch, STRUCTURED, None, texts) == generations

    learner = Learner(str(tiny_model_dir), LearnerConfig())
    samples = [Sample(tuple(p), g.token_ids, g.logprobs, 0.0, grammar=t) for p, g, t in zip(batch, generations, texts)]
    scored = learner._logprobs(samples, grad=False)
    for generation, logp in zip(generations, scored):
        assert generation.logprobs == pytest.approx(logp.tolist(), abs=1e-5)
    # Without the masks the same tokens are far less likely: the replay is what makes them agree.
    unmasked = learner._logprobs(
        [Sample(s.prompt_ids, s.response_ids, s.sampler_logprobs, 0.0) for s in samples], False
    )
    assert sum(u.sum() for u in unmasked) < sum(s.sum() for s in scored) - 1.0

    greedy = backend.generate(
        batch[:2], SamplingSettings(max_new_tokens=28, temperature=0, decoding="structured"), None, texts[:2]
    )
    assert all(re.fullmatch(f.regex, g.text) for g, f in zip(greedy, forms[:2]))


def test_a_structured_rollout_records_each_turns_grammar_and_plays_a_listed_move(tiny_model_dir):
    backend = make_backend("hf", str(tiny_model_dir))
    settings = RolloutSettings(sampling=STRUCTURED)
    engine = RolloutEngine({"model": backend}, settings)
    trajectories = list(engine.run(MatchSpec("kuhn_poker", ("model", "model"), seed) for seed in range(4)))
    turns = [turn for t in trajectories for turn in t.turns]
    assert turns and not any(turn.invalid for turn in turns)
    for turn in turns:
        assert (
            turn.grammar
            and turn.finish_reason == "stop"
            and turn.text in (BOXED.wrap(m) for m in ("bet", "check", "call", "fold"))
        )


def test_structured_decoding_refuses_a_free_text_game_without_a_grammar_and_top_p(monkeypatch):
    config = load_config(None, ["games=[kuhn_poker]", "rollout.decoding=structured"])
    validate(config)  # a game that lists its moves has the grammar of its moves
    with pytest.raises(UserError, match="top_p applies to free decoding only"):
        load_config(None, ["rollout.decoding=structured", "rollout.top_p=0.9"])
    game = make_game("kuhn_poker")
    monkeypatch.setattr(type(game), "lists_every_move", False)
    with pytest.raises(UserError, match="declares no answer grammar"):
        game.answer_grammar()
    with pytest.raises(UserError, match="rollout.decoding=structured needs each game's answer grammar"):
        validate(config)


@pytest.mark.parametrize(
    "game",
    ["secret_keeping(max_chars=12, benign=1, rounds=1)", "proposer_solver(attempts=2)", "arithmetic"],
)
def test_an_untrained_model_writes_only_moves_in_the_role_games_under_structured_decoding(tiny_model_dir, game):
    """Each role's answers have their game's form from the first step: messages, proposals that
    are valid tasks, and readable answers, though the model has learned nothing."""
    backend = make_backend("hf", str(tiny_model_dir))
    settings = RolloutSettings(sampling=replace(STRUCTURED, max_new_tokens=32))
    players = ("model",) * make_game(game).num_players
    trajectories = list(RolloutEngine({"model": backend}, settings).run(MatchSpec(game, players, s) for s in range(3)))
    turns = [turn for t in trajectories for turn in t.turns]
    assert len(turns) >= 3 * len(players) and not any(turn.invalid for turn in turns)
    assert all(turn.finish_reason == "stop" for turn in turns)
    if game.startswith("proposer_solver"):  # every proposal a valid task: every game reaches its solvers
        assert all(len(t.turns) == len(players) for t in trajectories)


def test_the_exact_probe_scores_moves_under_the_grammar_of_the_legal_moves(hf_model, tokenizer):
    """Under structured decoding a move's answer is scored with the masks of the grammar naming
    the legal moves: a policy of its own, not free decoding's."""
    structured = move_probabilities(hf_model, tokenizer, "kuhn_poker", RolloutSettings(sampling=STRUCTURED))
    free = move_probabilities(hf_model, tokenizer, "kuhn_poker", RolloutSettings())
    assert structured.keys() == free.keys() and len(structured) == 12
    assert all(sum(p.values()) == pytest.approx(1.0) for p in structured.values())
    assert structured != free
