"""SmolLM2-135M-Instruct, a real pretrained chat model (the session's `real_model`), through the
paths that the built-in model, whose tokenizer and chat template are selfplay's own, cannot
exercise: the model's chat template and end-of-turn token in both backends, legal and structured
decoding over its byte-level BPE vocabulary, the learner scoring the tokens the samplers wrote as they scored
them, LoRA and full updates, a trained checkpoint that `selfplay eval` and `selfplay play` load,
and the exact Kuhn Poker probe.

The model is converted once a session; the module holds one transformers backend, one learner
and one vLLM engine. Prompts show the state alone (the rules are most of a prompt's tokens) except
where the rules are the point, the training run is one step of two games, and freely sampled
answers are a few tokens long.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
import torch
from safetensors.torch import load_file

from selfplay.backends import Generation, PolicyBackend, SamplingSettings
from selfplay.backends.hf_backend import HFBackend
from selfplay.cli import main
from selfplay.config import LearnerConfig, LoraConfig
from selfplay.evaluation.exploitability import (
    exploitability_of,
    information_states,
    move_probabilities,
    policy_exploitability,
)
from selfplay.games import TextGameEnv, make_env
from selfplay.games.answers import AnswerFormat, AnswerGrammar
from selfplay.learner import Learner, Sample
from selfplay.legal_decoding import Choices, answer_choices
from selfplay.prompts import Message, PromptStyle, batch_prompt_ids, opening_messages, prompt_ids
from selfplay.rollouts import MatchSpec, RolloutEngine, RolloutSettings
from selfplay.scoring import response_logprobs
from selfplay.structured_decoding import grammar_text
from tests.test_legal_decoding import legal_logprobs

# Each test reads SmolLM2-135M, converted once a run from its GGUF (tens of seconds).
pytestmark = pytest.mark.slow

END_OF_TURN = "<|im_end|>"  # SmolLM2's; its end of text, <|endoftext|>, ends no chat turn
# The largest gaps measured (2 cores, float32) between a sampler's log-probability of a token and
# its recomputation by transformers as the learner scores it, over the decisions below with free
# and legal decoding: 1.6e-5 for the transformers sampler, 4.3e-5 for vLLM, whose kernels differ.
HF_LOGPROB_TOLERANCE = 1e-4
VLLM_LOGPROB_TOLERANCE = 5e-4
# A message of a free-text game: free content, bounded so that it ends within the tokens allowed
# (at most one token a character, and the end of the turn: 30).
MESSAGE_GRAMMAR = AnswerGrammar.around(AnswerFormat("<answer>", "</answer>"), "[^<>]{1,12}")
SAMPLING_TEMPERATURE = 0.7  # not 1, so that a sampler or learner leaving the temperature out is caught
# The most a Kuhn Poker policy can be exploited, by the worst of its 4,096 pure policies:
# exploitability is convex in the policy, so its maximum is at a pure one.
KUHN_MAX_EXPLOITABILITY = 17 / 12


@dataclass(frozen=True)
class Decision:
    """A turn of a game: the mover's messages and the answers naming its legal moves, in order."""

    env: TextGameEnv
    messages: list[Message]
    answers: tuple[str, ...]

    def move_of(self, answer: str) -> str:
        return self.env.legal_moves()[self.answers.index(answer)]


def decision(game: str, opening: tuple[str, ...] = (), prompt: PromptStyle = "view") -> Decision:
    """The turn after the moves `opening` in `game` (deal seed 0), asked in style `prompt`."""
    env = make_env(game)
    env.reset(seed=0)
    for move in opening:
        env.step(env.answer(move))
    messages = opening_messages(env.observe(env.agent_selection), prompt)
    return Decision(env, messages, tuple(env.answer(move) for move in env.legal_moves()))


@pytest.fixture(scope="module")
def decisions() -> list[Decision]:
    """Turns whose answers SmolLM2's vocabulary writes in the ways a BPE vocabulary can."""
    return [
        decision("kuhn_poker"),  # check or bet: '{', 'check', '}': a word, one token
        decision("kuhn_poker", ("bet",)),  # call or fold
        decision("tictactoe", ("4", "0")),  # cells: a digit, one token
        decision("nim"),  # 'p', 'ile', 'Ġ', '2', 'Ġtake', 'Ġ', '3': spaces apart from digits, and in words
        # 'x', '(', '0', ',', '2', ')}': the move's last character and the closing brace are one token
        decision("openspiel:tic_tac_toe"),
        # take:1; and take:12;: where one answer writes ';', another writes a second digit
        decision("openspiel:nim(pile_sizes=12;3)"),
    ]


@pytest.fixture(scope="module")
def hf_backend(real_model) -> HFBackend:
    return HFBackend(str(real_model))


@pytest.fixture(scope="module")
def vllm_backend(real_model):
    pytest.importorskip("vllm")
    from selfplay.backends.vllm_backend import VLLMBackend

    environment = dict(os.environ)
    engine = VLLMBackend(str(real_model))
    yield engine
    engine.close()
    # vLLM sets variables (library paths among them) that later tests must not inherit: the code
    # sandbox, for one, places the shared libraries they resolve to in its jail.
    os.environ.clear()
    os.environ.update(environment)


@pytest.fixture(params=["hf", pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.slow])])
def backend(request) -> PolicyBackend:
    """Each backend in turn: transformers, and vLLM (an engine takes 20-30 s to start on 2 cores)."""
    return request.getfixturevalue(f"{request.param}_backend")


@pytest.fixture(scope="module")
def learner(real_model) -> Learner:
    """A learner of the whole model, sampling at SAMPLING_TEMPERATURE, that no test updates."""
    return Learner(str(real_model), LearnerConfig(), temperature=SAMPLING_TEMPERATURE)


def logprob_tolerance(backend: PolicyBackend) -> float:
    return HF_LOGPROB_TOLERANCE if isinstance(backend, HFBackend) else VLLM_LOGPROB_TOLERANCE


def answer_ids(tokenizer, answer: str) -> tuple[int, ...]:
    """`answer` as the tokenizer writes it, then the end of the turn."""
    return (*tokenizer(answer, add_special_tokens=False)["input_ids"], tokenizer.convert_tokens_to_ids(END_OF_TURN))


def prompts_and_choices(tokenizer, turns: Sequence[Decision]) -> tuple[list[list[int]], list[Choices]]:
    """Each turn's prompt ids, and the answers legal decoding may write there, as the rollouts make them."""
    cache: dict[str, tuple[int, ...]] = {}
    choices = [answer_choices(turn.answers, tokenizer, tokenizer.eos_token_id, cache) for turn in turns]
    return batch_prompt_ids(tokenizer, [turn.messages for turn in turns]), choices


def largest_gap(generations: Sequence[Generation], logprobs: Sequence[torch.Tensor]) -> float:
    """The largest difference between a sampler's log-probability of a token and the one in `logprobs`."""
    return max((torch.tensor(g.logprobs) - lp.detach()).abs().max().item() for g, lp in zip(generations, logprobs))


def test_prompts_are_the_models_chat_template_to_the_token(hf_backend, decisions):
    tokenizer = hf_backend.tokenizer
    start, end = tokenizer.convert_tokens_to_ids(["<|im_start|>", END_OF_TURN])

    def text(words: str) -> list[int]:
        return tokenizer(words, add_special_tokens=False)["input_ids"]

    def message(role: str, content: str) -> list[int]:
        return [start, *text(f"{role}\n{content}"), end, *text("\n")]

    with_rules, view = decision("kuhn_poker", prompt="full").messages, decisions[0].messages
    assert [m["role"] for m in with_rules] == ["system", "user"] and [m["role"] for m in view] == ["user"]
    reply_cue = [start, *text("assistant\n")]
    assert prompt_ids(tokenizer, with_rules) == [
        *message("system", with_rules[0]["content"]),
        *message("user", with_rules[1]["content"]),
        *reply_cue,
    ]
    # Without a system message, SmolLM2's template writes its own.
    default_system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    assert prompt_ids(tokenizer, view) == [
        *message("system", default_system),
        *message("user", view[0]["content"]),
        *reply_cue,
    ]
    for messages in (with_rules, *(turn.messages for turn in decisions)):
        expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
        assert prompt_ids(tokenizer, messages) == expected["input_ids"]


def test_a_reply_ends_at_the_models_end_of_turn_token_kept_in_its_ids_and_not_its_text(backend, hf_backend):
    tokenizer = backend.tokenizer
    end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    assert backend.eos_ids == {end}  # not <|endoftext|>
    question = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = prompt_ids(tokenizer, question)
    assert prompt == prompt_ids(hf_backend.tokenizer, question)  # vLLM's tokenizer renders the same ids
    (reply,) = backend.generate([prompt], SamplingSettings(max_new_tokens=32, temperature=0.0))
    assert reply.finish_reason == "stop" and reply.token_ids[-1] == end and end not in reply.token_ids[:-1]
    assert reply.text == tokenizer.decode(reply.token_ids[:-1]) and "Paris" in reply.text
    assert END_OF_TURN not in reply.text
    (cut,) = backend.generate([prompt], SamplingSettings(max_new_tokens=3, temperature=0.0))
    assert cut.finish_reason == "length" and cut.token_ids == reply.token_ids[:3]
    assert cut.text == tokenizer.decode(cut.token_ids)


def test_a_multi_turn_chat_holds_each_reply_as_sampled_then_its_end_of_turn(hf_backend):
    """Each later prompt of a player's chat begins with its earlier prompt and reply, token for
    token: the template closes the reply's turn with the end-of-turn token that ended it."""
    settings = RolloutSettings(
        sampling=SamplingSettings(seed=0, decoding="legal"), observation_mode="multi_turn", prompt="view", max_turns=5
    )
    engine = RolloutEngine({"smollm2": hf_backend, "random": "random"}, settings)
    (game,) = engine.run([MatchSpec("tictactoe", ("smollm2", "random"), seed=0)])
    newline = hf_backend.tokenizer("\n", add_special_tokens=False)["input_ids"]
    assert len(game.turns) == 3  # the first player's moves of five
    for earlier, later in zip(game.turns, game.turns[1:]):
        carried = (*earlier.prompt_ids, *earlier.response_ids, *newline)
        assert later.prompt_ids[: len(carried)] == carried


def test_legal_decoding_writes_legal_answers_in_the_tokenizers_own_tokens_with_their_logprobs(
    backend, hf_backend, decisions
):
    tokenizer = backend.tokenizer
    prompts, choices = prompts_and_choices(tokenizer, decisions)
    generations = backend.generate(prompts, SamplingSettings(temperature=1.0, seed=0, decoding="legal"), choices)
    with torch.no_grad():
        expected = legal_logprobs(hf_backend.model, prompts, [g.token_ids for g in generations], choices)
    for turn, generation in zip(decisions, generations):
        assert generation.finish_reason == "stop" and generation.text in turn.answers
        assert turn.env.parse(generation.text) == turn.move_of(generation.text)
        assert generation.token_ids == answer_ids(tokenizer, generation.text)
    assert largest_gap(generations, expected) < logprob_tolerance(backend)


def test_legal_decoding_gives_the_answers_of_a_turn_probabilities_summing_to_one(hf_backend, decisions):
    """No probability is lost to a token that no whole answer continues."""
    prompts, choices = prompts_and_choices(hf_backend.tokenizer, decisions)
    turn_of = [turn for turn, tree in enumerate(choices) for _ in tree]
    with torch.no_grad():
        logprobs = legal_logprobs(
            hf_backend.model,
            [prompts[turn] for turn in turn_of],
            [answer for tree in choices for answer in tree],
            [choices[turn] for turn in turn_of],
        )
    mass = [0.0] * len(decisions)
    for turn, logp in zip(turn_of, logprobs):
        mass[turn] += math.exp(logp.sum().item())
    assert mass == pytest.approx([1.0] * len(decisions), abs=1e-5)


@pytest.mark.parametrize("decoding", ["free", "legal", "structured"])
def test_the_learner_scores_the_samplers_tokens_as_the_sampler_did(backend, learner, decisions, decoding):
    """Through the learner's own scoring: legal decoding's choices and structured decoding's
    grammars (each turn's move, or a free message) replayed as masks. Every structured answer
    keeps to its grammar."""
    prompts, choices = prompts_and_choices(backend.tokenizer, decisions)
    forms = [turn.env.game.answer_grammar() if i % 2 else MESSAGE_GRAMMAR for i, turn in enumerate(decisions)]
    grammars = [grammar_text(form) for form in forms]
    sampling = SamplingSettings(max_new_tokens=30, temperature=SAMPLING_TEMPERATURE, seed=1, decoding=decoding)
    legal, structured = decoding == "legal", decoding == "structured"
    generations = backend.generate(prompts, sampling, choices if legal else None, grammars if structured else None)
    samples = [
        Sample(tuple(prompt), g.token_ids, g.logprobs, 0.0, options if legal else (), grammar if structured else "")
        for prompt, g, options, grammar in zip(prompts, generations, choices, grammars)
    ]
    with torch.enable_grad():  # as an update scores them: each prompt and its response in one row
        scored = learner._logprobs(samples, grad=True)
    if structured:
        assert all(g.finish_reason == "stop" and re.fullmatch(f.regex, g.text) for g, f in zip(generations, forms))
    assert largest_gap(generations, scored) < logprob_tolerance(backend)


@pytest.mark.parametrize(("lora_rank", "lr"), [(0, 1e-5), (8, 1e-3)], ids=["full", "lora"])
def test_one_update_makes_the_rewarded_answer_likelier_and_the_penalised_one_less_likely(
    real_model, hf_backend, lora_rank, lr
):
    """On Kuhn Poker's first turn, betting rewarded (advantage +1) and checking penalised (-1);
    and the weights the learner hands a backend are the policy it updated (LoRA merged into the
    base, SmolLM2's output layer tied to its embedding)."""
    tokenizer = hf_backend.tokenizer
    kuhn = decision("kuhn_poker")
    prompt = tuple(prompt_ids(tokenizer, kuhn.messages))
    bet, check = (answer_ids(tokenizer, kuhn.env.answer(move)) for move in ("bet", "check"))

    def logprobs(model) -> list[torch.Tensor]:
        with torch.no_grad():
            return response_logprobs(model, [prompt] * 2, [bet, check])

    sampled = logprobs(hf_backend.model)  # the policy before the update, as the sampler serves it
    learner = Learner(str(real_model), LearnerConfig(lr=lr, lora=LoraConfig(rank=lora_rank)), seed=0)
    learner.update(
        [Sample(prompt, bet, tuple(sampled[0].tolist()), 1.0), Sample(prompt, check, tuple(sampled[1].tolist()), -1.0)]
    )
    updated = logprobs(learner.model)
    assert updated[0].sum() > sampled[0].sum() + 0.1 and updated[1].sum() < sampled[1].sum() - 0.1
    served = HFBackend(str(real_model))
    served.load_state(learner.policy_weights(), version=1)
    assert torch.cat(logprobs(served.model)).tolist() == pytest.approx(
        torch.cat(updated).tolist(), abs=HF_LOGPROB_TOLERANCE
    )


@pytest.mark.slow
def test_a_checkpoint_of_the_real_model_is_evaluated_and_played(real_model, tmp_path, capsys):
    """A step of LoRA training on two games of Kuhn Poker, then `selfplay eval` on the run and
    `selfplay play` with its checkpoint, all with legal decoding (without it the model writes no
    move) and the state alone as the prompt."""
    run_dir = tmp_path / "run"
    overrides = [
        f"model={real_model}",
        f"run_dir={run_dir}",
        "steps=1",
        "games={kuhn_poker: 1}",
        "rollout.games_per_step=2",
        "rollout.decoding=legal",
        "rollout.prompt=view",
        "learner.lora.rank=8",
        "learner.lr=1e-4",
    ]
    assert main(["train", "--no-progress", *overrides]) == 0
    checkpoint = run_dir / "checkpoints" / "step-000001"
    base, trained = load_file(real_model / "model.safetensors"), load_file(checkpoint / "model.safetensors")
    assert set(trained) == set(base)
    moved = {name for name in base if not torch.equal(base[name], trained[name])}
    adapted = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight")  # LoRA's target modules
    assert moved and all(name.endswith(adapted) for name in moved)
    for name in ("chat_template.jinja", "tokenizer.json", "generation_config.json"):
        assert (checkpoint / name).read_bytes() == (real_model / name).read_bytes()
    capsys.readouterr()

    out = tmp_path / "eval"
    argv = ["eval", "--checkpoints", str(run_dir), "--games", "kuhn_poker", "--episodes", "2", "--decoding", "legal"]
    assert main([*argv, "--prompt", "view", "--no-round-robin", "--no-progress", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    (match,) = results["matches"]
    assert (match["candidate"], match["opponent"], match["games"]) == ("run/step-000001", "random", 2)
    assert match["invalid_move_rate"] == 0.0
    (probe,) = results["exploitability"]
    assert 0.0 < probe["exploitability"] <= KUHN_MAX_EXPLOITABILITY
    capsys.readouterr()

    argv = ["play", "kuhn_poker", "--agents", f"model:{checkpoint},random", "--episodes", "2", "--decoding", "legal"]
    assert main([*argv, "--prompt", "view", "--json", "--no-progress"]) == 0
    agents = {row["agent"]: row for row in json.loads(capsys.readouterr().out)["agents"]}
    model = agents[f"model:{checkpoint}"]
    assert model["games"] == 2 and model["invalid_moves"] == 0


def test_the_exact_kuhn_probe_reads_the_models_own_move_probabilities(hf_backend):
    """As the rollouts sample by default (free decoding): each move's answer, then the end of the
    turn, normalised over the legal moves."""
    model, tokenizer = hf_backend.model, hf_backend.tokenizer
    exploitability = policy_exploitability(model, tokenizer, "kuhn_poker")
    probabilities = move_probabilities(model, tokenizer, "kuhn_poker")
    assert 0.0 < exploitability <= KUHN_MAX_EXPLOITABILITY
    assert exploitability == pytest.approx(exploitability_of("kuhn_poker", probabilities))

    # The second player holding the Queen, facing a bet, read here off the model's logits after
    # the prompt its own template writes.
    (state,) = [s for s in information_states("kuhn_poker") if s.key == "1b"]
    prompt = tokenizer.apply_chat_template(state.messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    totals = []
    for answer in state.answers:
        option = answer_ids(tokenizer, answer)
        with torch.no_grad():
            logits = model(torch.tensor([[*prompt, *option]])).logits[0, len(prompt) - 1 : -1]
        totals.append(logits.log_softmax(-1)[range(len(option)), option].sum())
    direct = torch.stack(totals).softmax(-1).tolist()
    assert [probabilities["1b"][action] for action in state.actions] == pytest.approx(direct, abs=1e-4)
