"""A LoRA learner's league snapshots: each is its adapter on disk, served over the main learner's
own model (peft's mixed-batch path, a bounded number of adapters resident), playing and probed
exactly as the same weights merged into a whole model (`eval` and `play` load them merged:
tests/test_model_specs.py)."""

from __future__ import annotations

import pytest
import torch

from selfplay.backends import SamplingSettings
from selfplay.backends.hf_backend import (
    MIN_SHARED_PREFIX,
    AdapterPool,
    HFBackend,
    PooledAdapter,
    common_prefix_length,
    merged_adapter_weights,
)
from selfplay.config import LearnerConfig, LoraConfig, load_config
from selfplay.default_model import resolve_model
from selfplay.errors import UserError
from selfplay.evaluation.exploitability import move_probabilities
from selfplay.league.matchmaking import MAIN
from selfplay.learner import TRAINED_ADAPTER, Learner, Sample
from selfplay.legal_decoding import allowed_mask
from selfplay.model_specs import model_spec
from selfplay.rollouts import MatchSpec, RolloutEngine, RolloutSettings
from selfplay.run_dir import is_adapter
from selfplay.scoring import response_logprobs, vocab_size
from selfplay.train import Trainer

LORA = LearnerConfig(lr=1e-2, lora=LoraConfig(rank=4, alpha=8.0))
SNAPSHOTS = ["main@000000", "main@000001", "main@000002"]


def _trained(learner: Learner, seed: int) -> Learner:
    """`learner` with its adapter moved away from zero, as training would move it."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in learner.model.named_parameters():
            if "lora_B" in name and f".{TRAINED_ADAPTER}." in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return learner


def test_a_snapshot_served_as_an_adapter_has_the_merged_models_exact_move_probabilities(tmp_path):
    base = resolve_model("default")
    main = Learner(base, LORA, seed=0)
    past = _trained(Learner(base, LORA, seed=1), seed=1)
    adapter = past.export_adapter(tmp_path / "main@000001")
    assert is_adapter(adapter)
    assert sorted(p.name for p in adapter.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    merged = past.policy_state_dict()
    assert all(torch.allclose(t, merged[n], atol=1e-6) for n, t in merged_adapter_weights(base, adapter).items())

    pooled = PooledAdapter(AdapterPool(main.model, capacity=1), "main@000001", adapter)
    served = HFBackend(base, model=main.model, frozen=True, adapter=pooled)
    whole = HFBackend(base, frozen=True)
    whole.load_state(merged, version=1)
    rollout = model_spec("default").played_with(RolloutSettings())  # as the default model plays: legal decoding
    with served.serving() as model:
        as_adapter = move_probabilities(model, served.tokenizer, "kuhn_poker", rollout)
    as_whole = move_probabilities(whole.model, whole.tokenizer, "kuhn_poker", rollout)
    assert as_adapter.keys() == as_whole.keys()
    gaps = [abs(p - as_whole[state][move]) for state, moves in as_adapter.items() for move, p in moves.items()]
    assert max(gaps) < 1e-4
    assert max(abs(p - 0.5) for moves in as_whole.values() for p in moves.values()) > 1e-3  # not the base's play
    # Sampled freely (model.generate, a shared prompt prefix run once), it draws the same answers.
    rules = "Kuhn poker: three cards, jack, queen and king; each player antes a chip and is dealt one card. " * 2
    prompts = [served.tokenizer(f"{rules}Name a card, player {i}:")["input_ids"] for i in range(3)]
    assert common_prefix_length(prompts) >= MIN_SHARED_PREFIX
    sampling = SamplingSettings(max_new_tokens=6, seed=7)
    for adapter_answer, whole_answer in zip(served.generate(prompts, sampling), whole.generate(prompts, sampling)):
        assert adapter_answer.token_ids == whole_answer.token_ids
        assert adapter_answer.logprobs == pytest.approx(whole_answer.logprobs, abs=1e-4)
    assert main.model.active_adapters == [TRAINED_ADAPTER] and main.model.training


def test_more_snapshots_than_resident_adapters_each_play_with_their_own_weights(tiny_model_dir, tmp_path, monkeypatch):
    overrides = [
        "games={kuhn_poker: 1}",
        "rollout.decoding=legal",  # a frozen backend keeps the hidden states it ran: its adapter's
        "rollout.max_new_tokens=4",
        "learner.lora.rank=4",
        "learner.lora.alpha=8",
        "league.enabled=true",
        "league.snapshot_every=1",
        "league.resident_adapters=2",
        f"model={tiny_model_dir}",
        f"run_dir={tmp_path}",
    ]
    trainer = Trainer(load_config(None, overrides), progress=False)
    roster, league, main = trainer.roster, trainer.league, trainer.learner
    trainable = {name for name, p in main.model.named_parameters() if p.requires_grad}
    assert trainable and all(f".{TRAINED_ADAPTER}." in name for name in trainable)
    for step in (1, 2):  # the main player trained, and frozen after each step
        _trained(main, step)
        league.record_step(step, [], {MAIN: step}, roster.freeze)
    assert [p.name for p in league.snapshots()] == SNAPSHOTS
    assert all(is_adapter(roster.snapshot_weights(name)) for name in SNAPSHOTS)
    monkeypatch.setattr(roster, "workers", object())  # a run resumed with rollout workers, which load whole weights
    with pytest.raises(UserError, match="is a LoRA adapter .* resume it without distributed.rollout_workers"):
        roster.snapshot_weights(SNAPSHOTS[1])
    monkeypatch.undo()
    # The initial snapshot is the untrained adapter: the initial policy.
    assert all(torch.equal(t, torch.zeros_like(t)) for t in _adapter_tensors(roster.snapshot_weights(SNAPSHOTS[0])))

    loads = []
    load_adapter = main.model.load_adapter

    def counted_load(directory, adapter_name, **options):
        loads.append(adapter_name)
        return load_adapter(directory, adapter_name, **options)

    monkeypatch.setattr(main.model, "load_adapter", counted_load)
    seats = [players for name in SNAPSHOTS for players in ((name, MAIN), (MAIN, name))]
    matches = [MatchSpec("kuhn_poker", players, seed) for seed, players in enumerate(seats)]
    trajectories = list(RolloutEngine(roster.seat(matches), trainer.rollout_settings).run(matches))
    played = [turn for trajectory in trajectories for turn in trajectory.turns if turn.agent in SNAPSHOTS]
    assert {turn.agent for turn in played} == set(SNAPSHOTS)
    assert len(roster.adapters.resident) == 2 and sorted(set(loads)) == SNAPSHOTS  # one was unloaded
    assert all(roster.frozen[name].tokenizer is main.tokenizer for name in SNAPSHOTS)  # no copy per past player
    # Each turn a snapshot played has the log-probabilities of its weights merged into a whole model,
    # and an exact probe reads an unloaded snapshot with its own adapter too (loaded again from disk).
    evicted = next(name for name in SNAPSHOTS if name not in roster.adapters.resident)
    loaded = loads.count(evicted)
    probed = roster.snapshot_policy(evicted, "kuhn_poker")
    assert loads.count(evicted) == loaded + 1 and evicted in roster.adapters.resident
    whole = HFBackend(str(tiny_model_dir))
    for name in SNAPSHOTS:
        whole.load_state(merged_adapter_weights(tiny_model_dir, roster.snapshot_weights(name)), version=0)
        assert_played_with(whole.model, [turn for turn in played if turn.agent == name])
        if name == evicted:
            exact = move_probabilities(whole.model, main.tokenizer, "kuhn_poker", trainer.rollout_settings)
            gaps = [abs(p - exact[state][move]) for state, moves in probed.items() for move, p in moves.items()]
            assert max(gaps) < 1e-4
    # The learner's own adapter stays the one active and trained: an update moves it alone.
    assert main.model.active_adapters == [TRAINED_ADAPTER] and main.model.training
    assert {name for name, p in main.model.named_parameters() if p.requires_grad} == trainable
    optimized = {id(p) for group in main.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for name, p in main.model.named_parameters() if name in trainable}
    before = {name: p.detach().clone() for name, p in main.model.named_parameters()}
    own = [turn for trajectory in trajectories for turn in trajectory.turns if turn.agent == MAIN]
    main.update([Sample(t.prompt_ids, t.response_ids, t.logprobs, 1.0, t.choices) for t in own])
    moved = {name for name, p in main.model.named_parameters() if not torch.equal(p, before[name])}
    assert moved and moved <= trainable

    # Retiring a snapshot unloads its adapter.
    resident = next(iter(roster.adapters.resident))
    roster.retire([resident])
    assert resident not in roster.adapters.resident and resident not in main.model.peft_config

    # Taken again (a resumed run replays a step its run stopped in before recording it), a snapshot
    # replaces the adapter left there, whole.
    leftover = roster.snapshot_weights("main@000002")
    before = _adapter_tensors(leftover)
    _trained(main, 3)
    assert roster.freeze(MAIN, "main@000002") == str(leftover.relative_to(tmp_path))
    assert not any(torch.equal(old, new) for old, new in zip(before, _adapter_tensors(leftover)))
    assert sorted(p.name for p in leftover.parent.iterdir()) == SNAPSHOTS  # no scratch directory left
    trainer.close()


def assert_played_with(model, turns) -> None:
    """Each of `turns` (legal decoding, temperature 1) has `model`'s log-probabilities, within 1e-4."""
    for turn in turns:
        mask = allowed_mask([turn.response_ids], [turn.choices], vocab_size(model))
        with torch.no_grad():
            (expected,) = response_logprobs(model, [turn.prompt_ids], [turn.response_ids], 1.0, mask)
        assert turn.logprobs == pytest.approx(expected.tolist(), abs=1e-4)


def assert_rows_as_alone(policies, prompts, greedy, extra: dict, tolerance: float = 1e-4) -> dict:
    """The generations of `prompts` in one mixed batch (`generate_rows`), row `i` by `policies[i]`
    (greedy, with `extra`'s choices or grammars, a list each), by row; asserting that each row
    has the tokens, log-probabilities (within `tolerance`) and version of its policy's
    generating its rows alone."""
    pairs = policies[0].generate_rows(policies, prompts, greedy, **extra)
    mixed = dict(pair for group in pairs for pair in group)
    for player in {id(policy): policy for policy in policies}.values():
        rows = [i for i, policy in enumerate(policies) if policy is player]
        alone = player.generate(
            [prompts[i] for i in rows], greedy, **{key: [value[i] for i in rows] for key, value in extra.items()}
        )
        for row, generation in zip(rows, alone):
            assert mixed[row].token_ids == generation.token_ids
            assert mixed[row].logprobs == pytest.approx(generation.logprobs, abs=tolerance)
            assert mixed[row].policy_version == player.version
    return mixed


def _adapter_tensors(directory):
    from safetensors.torch import load_file

    return [t for name, t in load_file(str(directory / "adapter_model.safetensors")).items() if "lora_B" in name]


def _adapter_state(learner: Learner) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in learner.model.named_parameters() if "lora_" in name}


def _unchanged(before: dict[str, torch.Tensor], learner: Learner) -> bool:
    return all(torch.equal(before[name], tensor) for name, tensor in _adapter_state(learner).items())


def test_the_main_player_and_its_exploiters_train_their_own_adapters_over_one_base(tiny_model_dir, tmp_path):
    overrides = [
        "games={kuhn_poker: 1}",
        "rollout.decoding=legal",
        "learner.lora.rank=4",
        "learner.lora.alpha=8",
        "learner.lr=1e-2",
        "league.enabled=true",
        "league.main_exploiters=1",
        "league.league_exploiters=1",
        "league.exploiter_lora_rank=4",
        f"model={tiny_model_dir}",
        f"run_dir={tmp_path}",
    ]
    trainer = Trainer(load_config(None, overrides), progress=False)
    roster = trainer.roster
    learners = [player.learner for player in roster.players.values()]
    assert len(learners) == 3
    base = dict(roster.shared_base.named_parameters())
    for player in roster.players.values():  # one base under every adapter, and each generates with its own
        weights = {id(p) for name, p in player.learner.model.named_parameters() if "lora_" not in name}
        assert weights == {id(p) for p in base.values()}
        assert player.backend.shares_model and player.backend.model is player.learner.model
    optimized = [{id(p) for group in learner.optimizer.param_groups for p in group["params"]} for learner in learners]
    assert all(not (a & b) for i, a in enumerate(optimized) for b in optimized[i + 1 :])

    frozen_base = {name: tensor.clone() for name, tensor in base.items()}
    prompt = tuple(learners[0].tokenizer("Kuhn poker: you hold the king.")["input_ids"])
    for trained in learners:  # each update moves its own adapter alone
        before = [_adapter_state(learner) for learner in learners]
        with torch.no_grad():
            (logp,) = response_logprobs(trained.model, [prompt], [[5, 6]])
        trained.update([Sample(prompt, (5, 6), tuple(logp.tolist()), 1.0)])
        assert not _unchanged(before[learners.index(trained)], trained)
        assert all(_unchanged(state, other) for state, other in zip(before, learners) if other is not trained)
    assert all(torch.equal(frozen_base[name], tensor) for name, tensor in base.items())
    trainer.close()


@pytest.fixture(scope="module")
def mixed_league(tiny_model_dir, tmp_path_factory):
    """The main LoRA learner's backend and three adapter snapshots' over its model (two resident
    at once), each adapter trained apart, and eight prompts of one rules prefix."""
    directory = tmp_path_factory.mktemp("adapters")
    main = _trained(Learner(str(tiny_model_dir), LORA, seed=0), seed=0)
    pool = AdapterPool(main.model, capacity=2)
    players = [HFBackend(str(tiny_model_dir), model=main.model)]
    for index in (1, 2, 3):
        saved = _trained(Learner(str(tiny_model_dir), LORA, seed=index), seed=index).export_adapter(
            directory / str(index)
        )
        snapshot = HFBackend(
            str(tiny_model_dir), model=main.model, frozen=True, adapter=PooledAdapter(pool, str(index), saved)
        )
        snapshot.version = index
        players.append(snapshot)
    rules = "Kuhn poker: three cards, jack, queen and king; each player antes a chip and is dealt one card. " * 2
    tokenizer = players[0].tokenizer
    prompts = [tokenizer(f"{rules}Player {i}{'!' * i}, your move:")["input_ids"] for i in range(8)]
    assert common_prefix_length(prompts) >= MIN_SHARED_PREFIX
    return main, players, prompts


@pytest.mark.parametrize("decoding", ["free", "legal", "structured"])
def test_a_mixed_batch_of_adapters_gives_each_row_what_its_adapter_gives_alone(mixed_league, decoding):
    from selfplay.games import make_game
    from selfplay.legal_decoding import answer_choices
    from selfplay.structured_decoding import grammar_text

    main, players, prompts = mixed_league
    tokenizer = players[0].tokenizer
    policies = [players[i % len(players)] for i in range(len(prompts))]  # every adapter, and the learner's own
    game = make_game("kuhn_poker")
    answers = [game.answer_format.wrap(move) for move in ("bet", "check")]
    choices = [answer_choices(answers, tokenizer, tokenizer.eos_token_id, {})] * len(prompts)
    grammars = [grammar_text(game.answer_grammar())] * len(prompts)
    extra = {"legal": {"choices": choices}, "structured": {"grammars": grammars}}.get(decoding, {})
    greedy = SamplingSettings(max_new_tokens=6, temperature=0.0, decoding=decoding)

    mixed = assert_rows_as_alone(policies, prompts, greedy, extra)
    as_learner = players[0].generate(prompts, greedy, **extra)  # the adapters play apart
    assert max(abs(a - b) for row, g in enumerate(as_learner) for a, b in zip(g.logprobs, mixed[row].logprobs)) > 1e-3
    assert main.model.active_adapters == [TRAINED_ADAPTER] and main.model.training


def test_a_sampled_mixed_batch_repeats_with_its_seed_and_has_each_adapters_log_probabilities(mixed_league):
    main, players, prompts = mixed_league
    policies = [players[i % len(players)] for i in range(len(prompts))]
    sampling = SamplingSettings(max_new_tokens=6, temperature=1.0, seed=5)
    first, again = ([g for _, g in sorted(next(players[1].generate_rows(policies, prompts, sampling)))] for _ in "ab")
    assert first == again
    for policy, prompt, generation in zip(policies, prompts, first):
        with policy.serving() as model:
            (expected,) = response_logprobs(model, [prompt], [generation.token_ids])
        assert generation.logprobs == pytest.approx(expected.tolist(), abs=1e-4)


def test_the_engine_samples_every_adapter_over_one_model_in_one_batch(mixed_league, monkeypatch):
    _, players, _ = mixed_league
    seated = {f"p{i}": player for i, player in enumerate(players)}
    batches = []
    generate_rows = HFBackend._generate_rows

    def recorded(self, policies, *args):
        batches.append(len({id(policy) for policy in policies}))
        return generate_rows(self, policies, *args)

    monkeypatch.setattr(HFBackend, "_generate_rows", recorded)
    settings = RolloutSettings(sampling=SamplingSettings(max_new_tokens=4, decoding="legal"))
    matches = [MatchSpec("kuhn_poker", (a, b), seed) for seed, (a, b) in enumerate(zip(seated, [*seated][1:] + ["p0"]))]
    trajectories = list(RolloutEngine(seated, settings).run(matches))
    assert {turn.agent for trajectory in trajectories for turn in trajectory.turns} == set(seated)
    assert batches[0] == len(players)  # the first turn of every game, whoever plays it, in one batch


def test_the_learners_own_rows_compute_as_without_a_pool_on_peft_s_plain_path(mixed_league, monkeypatch):
    """While snapshots' adapters are routed, a call whose rows are all the learner's own runs
    peft's plain path (no copy of every row for the mixed path), to the same bits."""
    from peft.tuners.lora import Linear

    main, players, prompts = mixed_league
    ids = torch.tensor([prompts[0]] * 3)
    with torch.no_grad():
        plain = main.model(input_ids=ids).logits
    mixed_calls = []
    mixed_batch_forward = Linear._mixed_batch_forward
    monkeypatch.setattr(
        Linear, "_mixed_batch_forward", lambda *a, **k: mixed_calls.append(1) or mixed_batch_forward(*a, **k)
    )
    pool = players[1].adapter.pool
    adapters = [(p.adapter.name, p.adapter.directory) for p in players[1:3]]
    with pool.routed(adapters), torch.no_grad():
        with pool.rows([TRAINED_ADAPTER]):
            own = main.model(input_ids=ids).logits
        assert not mixed_calls
        with pool.rows([TRAINED_ADAPTER, players[1].adapter.name, TRAINED_ADAPTER]):
            mixed = main.model(input_ids=ids).logits
        assert mixed_calls
    assert torch.equal(own, plain)
    assert torch.allclose(mixed[0], plain[0], atol=1e-5)
    assert not torch.allclose(mixed[1], plain[1], atol=1e-3)  # the snapshot's row: its own adapter
