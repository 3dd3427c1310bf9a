"""A LoRA run with `backend: vllm`: one engine serves the base model and every adapter (the
learning players', each sync loading the new adapter and no whole weights, and the league's
adapter snapshots'), each request carrying its player's, with the log-probabilities of the same
weights merged into a whole model.

Starting a vLLM engine takes tens of seconds on CPU: one training run's engine serves the whole
module, and the tests after the first go on from the two steps it trains.
"""

from __future__ import annotations

import pytest

from selfplay.errors import UserError

pytest.importorskip("vllm")

import torch  # noqa: E402

from selfplay.backends import SamplingSettings  # noqa: E402
from selfplay.backends.hf_backend import HFBackend, merged_adapter_weights  # noqa: E402
from selfplay.backends.vllm_backend import VLLMBackend, adapter_engine_options  # noqa: E402
from selfplay.config import load_config  # noqa: E402
from selfplay.evaluation.exploitability import move_probabilities  # noqa: E402
from selfplay.league.matchmaking import MAIN  # noqa: E402
from selfplay.learner import Learner  # noqa: E402
from selfplay.rollouts import MatchSpec, RolloutEngine  # noqa: E402
from selfplay.run_dir import is_adapter  # noqa: E402
from selfplay.scoring import response_logprobs  # noqa: E402
from selfplay.train import Trainer  # noqa: E402
from tests.test_league_adapters import _trained, assert_played_with, assert_rows_as_alone  # noqa: E402

LOGPROB_TOLERANCE = 1e-4  # fp32 engine against transformers (tests/test_vllm_backend.py measured 2.4e-6)
EXPLOITER = "main_exploiter_0"


def test_the_engine_is_sized_from_the_ranks_and_adapters_it_serves():
    assert adapter_engine_options([4], 3) == {
        "enable_lora": True,
        "max_lora_rank": 8,
        "max_loras": 3,
        "max_cpu_loras": 3,
    }
    assert adapter_engine_options([16, 8], 10)["max_lora_rank"] == 16
    assert adapter_engine_options([17], 1)["max_lora_rank"] == 32
    with pytest.raises(UserError, match="rank up to 512; this run trains rank 600: lower learner.lora.rank"):
        adapter_engine_options([600, 8], 1)


@pytest.fixture(scope="module")
def trainer(tiny_model_dir, tmp_path_factory):
    overrides = [
        "backend=vllm",
        "steps=2",
        "games={kuhn_poker: 1}",
        "rollout.games_per_step=8",
        "rollout.decoding=legal",
        "rollout.max_new_tokens=4",
        "learner.lr=1e-2",
        "learner.lora.rank=4",
        "learner.lora.alpha=8",
        "league.enabled=true",
        "league.main_exploiters=1",
        "league.exploiter_lr=1e-2",
        "league.snapshot_every=1",
        "league.resident_adapters=1",  # room for 3 adapters: the two learning players' and one snapshot's
        f"model={tiny_model_dir}",
        f"run_dir={tmp_path_factory.mktemp('run')}",
    ]
    trainer = Trainer(load_config(None, overrides), progress=False)
    yield trainer
    trainer.close()


@pytest.mark.vllm
@pytest.mark.slow
def test_a_lora_run_syncs_adapters_into_one_engine_and_no_whole_weights(trainer, monkeypatch):
    def refused(*args, **kwargs):
        raise AssertionError("a LoRA run sent whole weights to vLLM")

    for whole_weights in (
        (VLLMBackend, "load_state"),
        (VLLMBackend, "load_weights"),
        (Learner, "policy_weights"),
    ):
        monkeypatch.setattr(*whole_weights, refused)
    engine = trainer.backend
    assert isinstance(engine, VLLMBackend) and engine.serves_adapters
    lora = engine.llm.llm_engine.vllm_config.lora_config
    assert (lora.max_lora_rank, lora.max_loras, lora.max_cpu_loras) == (8, 3, 3)  # exploiters' rank 8

    for _ in range(2):  # the loop of `Trainer.run`, which would close the engine at its end
        trainer.step += 1
        metrics = trainer.train_step()
        assert metrics["time/sync_s"] < metrics["time/learn_s"]
    roster = trainer.roster
    players = roster.players.values()
    assert all(player.backend.llm is engine.llm for player in players)
    assert all(player.backend.version == 2 and player.backend.adapter is not None for player in players)
    snapshots = [player.name for player in trainer.league.snapshots()]
    assert len(snapshots) > 3 and all(is_adapter(roster.snapshot_weights(name)) for name in snapshots)
    # Each sync replaced its player's adapter: the engine holds no older version, and only the
    # current one's directory is left.
    current = {player.backend.adapter.lora_int_id for player in players}
    served = {backend.adapter.lora_int_id for backend in roster.frozen.values()}
    assert current <= set(engine.llm.llm_engine.list_loras()) <= current | served
    assert sorted(p.name for p in engine.scratch.iterdir()) == sorted(
        p.backend.adapter.lora_path.rsplit("/", 1)[1] for p in players
    )


@pytest.mark.vllm
@pytest.mark.slow
def test_the_engine_samples_each_learning_player_with_its_learners_log_probabilities(trainer, tokenizer):
    roster = trainer.roster
    prompts = [tokenizer(f"Kuhn poker, player {i}: you hold the king. Your move:")["input_ids"] for i in range(4)]
    sampling = SamplingSettings(max_new_tokens=12, temperature=1.0, seed=3)
    for seed, name in enumerate((MAIN, EXPLOITER)):
        player = roster.players[name]
        _trained(player.learner, seed=10 + seed)
        roster.sync(player, version=3)
        learner_model = player.learner.model
        training = learner_model.training
        learner_model.eval()
        generations = player.backend.generate(prompts, sampling)
        with torch.no_grad():
            expected = response_logprobs(learner_model, prompts, [g.token_ids for g in generations])
            with learner_model.disable_adapter():
                base = response_logprobs(learner_model, prompts, [g.token_ids for g in generations])
        learner_model.train(training)
        gaps = [torch.tensor(g.logprobs) - e for g, e in zip(generations, expected)]
        assert max(gap.abs().max().item() for gap in gaps) < LOGPROB_TOLERANCE
        assert max((b - e).abs().max().item() for b, e in zip(base, expected)) > 100 * LOGPROB_TOLERANCE
        assert all(g.policy_version == 3 for g in generations)


@pytest.mark.vllm
@pytest.mark.slow
def test_more_snapshots_than_adapter_slots_each_play_as_their_merged_weights(trainer, tiny_model_dir):
    roster = trainer.roster
    engine = trainer.backend
    snapshots = [player.name for player in trainer.league.snapshots()]
    seats = [players for name in snapshots for players in ((name, MAIN), (MAIN, name))]
    matches = [MatchSpec("kuhn_poker", players, seed) for seed, players in enumerate(seats)]
    seated = roster.seat(matches)
    assert all(isinstance(seated[name], VLLMBackend) and seated[name].llm is engine.llm for name in snapshots)
    trajectories = list(RolloutEngine(seated, trainer.rollout_settings).run(matches))
    played = [turn for trajectory in trajectories for turn in trajectory.turns if turn.agent in snapshots]
    assert {turn.agent for turn in played} == set(snapshots)
    assert len(engine.llm.llm_engine.list_loras()) <= 3 < len(snapshots) + len(roster.players)

    whole = HFBackend(str(tiny_model_dir))
    prompts = [turn.prompt_ids for turn in played[:4]]
    greedy = SamplingSettings(max_new_tokens=8, temperature=0.0)
    for name in snapshots:
        whole.load_state(merged_adapter_weights(tiny_model_dir, roster.snapshot_weights(name)), version=0)
        assert_played_with(whole.model, [turn for turn in played if turn.agent == name])
        # Sampled freely, greedily: the merged model's tokens and log-probabilities.
        for served, merged in zip(seated[name].generate(prompts, greedy), whole.generate(prompts, greedy)):
            assert served.token_ids == merged.token_ids
            assert served.logprobs == pytest.approx(merged.logprobs, abs=LOGPROB_TOLERANCE)

    # Exact probes read a snapshot through transformers, with its own adapter.
    name = snapshots[-1]
    probed = roster.snapshot_policy(name, "kuhn_poker")
    assert name in roster.adapters.resident
    whole.load_state(merged_adapter_weights(tiny_model_dir, roster.snapshot_weights(name)), version=0)
    exact = move_probabilities(whole.model, whole.tokenizer, "kuhn_poker", trainer.rollout_settings)
    assert max(abs(p - exact[state][move]) for state, moves in probed.items() for move, p in moves.items()) < 1e-4

    # A retired snapshot's adapter leaves the engine.
    retired = roster.frozen[snapshots[1]].adapter.lora_int_id
    roster.retire([snapshots[1]])
    assert retired not in engine.llm.llm_engine.list_loras() and snapshots[1] not in roster.frozen


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("decoding", ["free", "legal"])
def test_a_mixed_batch_of_adapters_gives_each_row_what_its_adapter_gives_alone(trainer, tokenizer, decoding):
    from selfplay.legal_decoding import answer_choices

    roster = trainer.roster
    snapshots = [player.name for player in trainer.league.snapshots()][-2:]
    players = [roster.players[MAIN].backend, roster.players[EXPLOITER].backend, *map(roster.frozen_backend, snapshots)]
    assert len({id(player.engine_key) for player in players}) == 1
    prompts = [tokenizer(f"Kuhn poker, player {i}: you hold the king. Your move:")["input_ids"] for i in range(8)]
    policies = [players[i % len(players)] for i in range(len(prompts))]
    choices = [answer_choices(["\\boxed{bet}", "\\boxed{check}"], tokenizer, tokenizer.eos_token_id, {})] * len(prompts)
    extra = {"choices": choices} if decoding == "legal" else {}
    greedy = SamplingSettings(max_new_tokens=6, temperature=0.0, decoding=decoding)
    assert_rows_as_alone(policies, prompts, greedy, extra, LOGPROB_TOLERANCE)
