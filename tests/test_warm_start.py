"""The warm start of the default model: random-legal-play examples and the SFT loop."""

from __future__ import annotations

import itertools
import re

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from selfplay.backends.hf_backend import HFBackend  # noqa: E402
from selfplay.games import make_env, make_game  # noqa: E402
from selfplay.prompts import PROMPT_STYLES  # noqa: E402
from selfplay.untrained_model import RECIPE_GAMES, build_untrained  # noqa: E402
from selfplay.warm_start import (  # noqa: E402
    EOS_TOKEN,
    legal_move_rate,
    legal_play_examples,
    policy_targets,
    random_legal_play,
    tilted_probs,
    warm_start,
)

ASSISTANT_CUE = "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def untrained(tmp_path_factory):
    return build_untrained(tmp_path_factory.mktemp("untrained"))


@pytest.fixture(scope="module")
def tokenizer(untrained):
    return transformers.AutoTokenizer.from_pretrained(untrained)


def test_examples_are_well_formed_in_both_modes_and_styles(tokenizer):
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    decisions = random_legal_play(seed=3, multi_turn_share=0.5)
    examples = legal_play_examples(3, tokenizer, multi_turn_share=0.5, max_prompt_tokens=4096)
    seen = set()
    formats = {name: make_game(name).answer_format for name in RECIPE_GAMES}
    for decision, (prompt, response) in itertools.islice(zip(decisions, examples), 300):
        seen.add((decision.game, decision.mode, decision.style))
        assert response[-1] == eos and eos not in response[:-1]
        answer_format = formats[decision.game]
        assert tokenizer.decode(response[:-1]) == decision.answer == answer_format.wrap(decision.move)
        assert decision.move in decision.legal_moves
        text = tokenizer.decode(prompt)
        assert text.endswith(ASSISTANT_CUE)
        opening = "system" if decision.style == "full" else "user"
        assert text.startswith(f"<|im_start|>{opening}\n" + decision.messages[0]["content"])
        assert text.endswith(decision.messages[-1]["content"] + "<|im_end|>\n" + ASSISTANT_CUE)
        replies = [m for m in decision.messages if m["role"] == "assistant"]
        assert text.count(ASSISTANT_CUE) == len(replies) + 1
        if decision.mode == "single_turn":
            assert [m["role"] for m in decision.messages] == (["system", "user"] if opening == "system" else ["user"])
        else:
            assert replies and [m["role"] for m in decision.messages[-2:]] == ["assistant", "user"]
            assert all(answer_format.extract(m["content"]) for m in replies)
        listed = re.findall(r"Legal moves: (.*)", decision.messages[-1]["content"])
        if listed:
            assert decision.move in listed[-1].split(", ")
        if decision.style == "view":
            assert all("Legal moves" not in m["content"] for m in decision.messages)
    assert {game for game, _, _ in seen} == set(RECIPE_GAMES)
    modes_and_styles = itertools.product(("single_turn", "multi_turn"), PROMPT_STYLES)
    assert {(mode, style) for _, mode, style in seen} == set(modes_and_styles)


def test_a_digit_is_one_token_wherever_it_stands(tokenizer):
    # A legal cell must read the same in the board, the list of legal moves and the answer,
    # or copying it from the prompt is a mapping the model must learn token by token.
    env = make_env("tictactoe")
    env.reset(seed=0)
    state = env.observe(env.agent_selection)["state"]
    digit_ids = {str(d): tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)}
    assert len(set(digit_ids.values())) == 10
    pieces = [tokenizer.decode([i]) for i in tokenizer(state + "\\boxed{12}", add_special_tokens=False)["input_ids"]]
    digits = [p for p in pieces if any(c.isdigit() for c in p)]
    assert digits and all(p in digit_ids for p in digits)
    assert digits[-2:] == ["1", "2"]


def test_multi_turn_prompts_are_capped(tokenizer):
    examples = legal_play_examples(0, tokenizer, games=["connect_four"], multi_turn_share=1.0, max_prompt_tokens=600)
    lengths = [len(prompt) for prompt, _ in itertools.islice(examples, 100)]
    assert max(lengths) <= 600
    assert max(lengths) > 400  # some chats with earlier moves fit under the cap


def test_policy_targets_are_the_random_legal_players_distribution():
    legal = [[1, 5, 9], [1, 6, 9], [1, 6, 8, 9], [2, 9]]
    targets = policy_targets([1, 6, 8, 9], legal, [0.25] * 4)
    as_dicts = [dict(zip(ids, probs)) for ids, probs in targets]
    expected = [{1: 0.75, 2: 0.25}, {5: 1 / 3, 6: 2 / 3}, {9: 0.5, 8: 0.5}, {9: 1.0}]
    assert all(got == pytest.approx(want) for got, want in zip(as_dicts, expected, strict=True))
    tilted = [dict(zip(ids, probs)) for ids, probs in policy_targets([1, 6, 8, 9], legal, [0.1, 0.2, 0.3, 0.4])]
    assert tilted[0] == pytest.approx({1: 0.6, 2: 0.4})
    assert tilted[1] == pytest.approx({5: 1 / 6, 6: 5 / 6})
    assert tilted[2] == pytest.approx({9: 0.4, 8: 0.6})


def test_the_random_player_prefers_moves_by_state():
    same = tilted_probs("Your card: K.", 2, seed=0)
    assert same == tilted_probs("Your card: K.", 2, seed=0) and sum(same) == pytest.approx(1.0)
    cards = [tilted_probs(f"Your card: {card}.", 2, seed=0)[0] for card in "JQK"]
    assert len(set(cards)) == 3
    assert tilted_probs("Your card: K.", 3, seed=0, tilt=0.0) == pytest.approx([1 / 3] * 3)
    decisions = itertools.islice(random_legal_play(seed=0, games=["kuhn_poker"]), 600)
    bets = {}
    for d in decisions:
        if d.style == "full" and d.legal_moves == ("check", "bet") and d.messages[-1]["content"].count("checked") == 0:
            bets.setdefault(d.messages[-1]["content"], []).append(d.move == "bet")
    openings = [sum(v) / len(v) for v in bets.values()]
    assert len(openings) == 3 and max(openings) - min(openings) > 0.2
    uniform = itertools.islice(random_legal_play(seed=0, games=["kuhn_poker"], tilt=0.0), 50)
    assert all(d.move_probs == pytest.approx([1 / len(d.legal_moves)] * len(d.legal_moves)) for d in uniform)


# bf16 takes 6 steps: CPUs without bf16 instructions emulate it, at about 7 s a step on 2 cores.
@pytest.mark.slow
@pytest.mark.parametrize(("precision", "steps"), [("fp32", 24), ("bf16", 6)])
def test_warm_start_lowers_the_loss_and_saves_a_loadable_model(untrained, tmp_path, precision, steps):
    out = tmp_path / "warm"
    result = warm_start(
        untrained,
        out,
        steps=steps,
        batch_size=4,
        lr=3e-3,
        seed=0,
        games={"kuhn_poker": 1.0},
        precision=precision,
        progress=False,
    )
    losses = result["losses"]
    assert len(losses) == steps
    window = steps // 6
    assert sum(losses[-window:]) / window < 0.5 * sum(losses[:window]) / window
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # autocast leaves weights fp32
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert model.config.vocab_size >= len(tok)
    assert (out / "model.safetensors").exists()
    rate = legal_move_rate(HFBackend(str(out)), "kuhn_poker", n=4, seed=0)
    assert 0.0 <= rate <= 1.0


@pytest.mark.slow
def test_warm_start_is_deterministic(untrained, tmp_path):
    for name in ("a", "b"):
        warm_start(untrained, tmp_path / name, steps=3, batch_size=2, seed=7, progress=False)
    a = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "a").state_dict()
    b = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "b").state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[key], b[key]) for key in a)
    c = transformers.AutoModelForCausalLM.from_pretrained(untrained).state_dict()
    assert not all(torch.equal(a[key], c[key]) for key in a)
