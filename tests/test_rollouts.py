from collections import Counter

import pytest

from selfplay.backends import SamplingSettings
from selfplay.backends.hf_backend import HFBackend
from selfplay.config import RolloutConfig
from selfplay.games import InvalidMovePolicy
from selfplay.rollouts import MatchSpec, RolloutEngine, RolloutSettings
from tests.fakes import LegalMoveBackend, ShuffledHandoverBackend

MIXED_GAMES = ["tictactoe", "kuhn_poker", "connect_four", "leduc_holdem", "negotiation", "openspiel:connect_four"]


def test_the_rollout_section_of_a_config_reaches_the_engine_field_by_field():
    config = RolloutConfig(
        games_per_step=8,
        concurrency=3,
        observation_mode="multi_turn",
        prompt="view",
        max_turns=7,
        max_new_tokens=5,
        temperature=0.5,
        decoding="legal",
        retries=2,
        invalid_penalty=-2.0,
        invalid_opponent_reward=1.0,
    )
    assert RolloutSettings.from_config(config) == RolloutSettings(
        sampling=SamplingSettings(max_new_tokens=5, temperature=0.5, decoding="legal"),
        observation_mode="multi_turn",
        prompt="view",
        max_turns=7,
        invalid_moves=InvalidMovePolicy(retries=2, penalty=-2.0, opponent_reward=1.0),
        concurrency=3,
    )
    assert RolloutSettings.from_config(RolloutConfig(top_p=0.9)).sampling.top_p == 0.9


@pytest.fixture(scope="module")
def hf_backend(tiny_model_dir):
    return HFBackend(str(tiny_model_dir))


def mixed_matches(count: int) -> list[MatchSpec]:
    """Self-play, model-vs-scripted in both seats, across several games."""
    pairings = [("policy", "policy"), ("policy", "random"), ("random", "policy"), ("mcts", "policy")]
    matches = []
    for i in range(count):
        game = MIXED_GAMES[i % len(MIXED_GAMES)]
        players = pairings[i % len(pairings)]
        if "mcts" in players and game in ("negotiation", "kuhn_poker", "leduc_holdem"):
            players = ("policy", "random")
        matches.append(MatchSpec(game, players, seed=100 + i))
    return matches


def play_mixed_batch(backend, tokenizer):
    """Twelve mixed matches played through `backend`, checked well formed; returns the matches,
    the players and settings (to play them again) and the trajectories."""
    matches = mixed_matches(12)
    settings = RolloutSettings(sampling=SamplingSettings(max_new_tokens=12, seed=5), invalid_moves=InvalidMovePolicy(2))
    players = {"policy": backend, "random": "random", "mcts": "mcts:20"}
    trajectories = list(RolloutEngine(players, settings).run(matches))
    check_well_formed(trajectories, matches, tokenizer)
    assert sum(len(t.turns) for t in trajectories) >= 24
    return matches, players, settings, trajectories


def check_well_formed(trajectories, matches, tokenizer=None):
    assert sorted(t.result.seed for t in trajectories) == sorted(m.seed for m in matches)
    for trajectory in trajectories:
        result = trajectory.result
        assert result.end_reason in ("game_over", "invalid_move", "turn_cap")
        invalid_by_seat = Counter(turn.seat for turn in trajectory.turns if turn.invalid)
        for seat, label in enumerate(result.players):
            if label == "policy":
                assert invalid_by_seat[seat] == result.invalid_moves[seat]
        for turn in trajectory.turns:
            assert turn.game == result.game and turn.match_seed == result.seed
            assert result.players[turn.seat] == turn.agent == "policy"
            assert turn.role == f"player_{turn.seat}"
            assert turn.prompt_ids and turn.response_ids
            assert len(turn.response_ids) == len(turn.logprobs)
            assert all(lp <= 0 for lp in turn.logprobs)
            assert turn.finish_reason in ("stop", "length")
            if tokenizer is not None:
                assert tokenizer.decode(turn.prompt_ids).endswith("<|im_start|>assistant\n")


def test_every_waiting_turn_joins_one_batch_per_policy(tokenizer):
    """Games at different points (whose turn, which game) are all batched together."""
    policy = LegalMoveBackend(tokenizer)
    matches = mixed_matches(24)
    engine = RolloutEngine({"policy": policy, "random": "random", "mcts": "mcts:20"}, RolloutSettings(concurrency=24))
    trajectories = list(engine.run(matches))
    check_well_formed(trajectories, matches, tokenizer)
    # All 24 games wait on the policy at the first tick, whichever seat it has.
    assert policy.batch_sizes[0] == 24
    assert sum(policy.batch_sizes) == sum(len(t.turns) for t in trajectories)
    # Legal answers: games end by their rules, never by an invalid move.
    assert all(t.result.end_reason != "invalid_move" for t in trajectories)
    assert max(len(t.turns) for t in trajectories) > 5


def test_finished_games_are_replaced_so_batches_stay_full(tokenizer):
    policy = LegalMoveBackend(tokenizer)
    matches = [MatchSpec("kuhn_poker", ("policy", "policy"), seed=i) for i in range(40)]
    list(RolloutEngine({"policy": policy}, RolloutSettings(concurrency=8)).run(matches))
    # Every batch but the last few (as the queue drains) holds the full 8 games.
    assert policy.batch_sizes[:5] == [8] * 5


@pytest.mark.parametrize("observation_mode", ["single_turn", "multi_turn"])
def test_records_do_not_depend_on_the_order_responses_finish_in(tokenizer, observation_mode):
    """An engine hands responses over as they finish, in an order that varies from run to run;
    batches and records stay those of a backend that hands each batch over whole."""
    matches = mixed_matches(30)
    settings = RolloutSettings(observation_mode=observation_mode, concurrency=12)

    def play(policy):
        return list(RolloutEngine({"policy": policy, "random": "random", "mcts": "mcts:20"}, settings).run(matches))

    whole = LegalMoveBackend(tokenizer)
    expected = play(whole)
    check_well_formed(expected, matches, tokenizer)
    for handover_seed in (1, 2):
        shuffled = ShuffledHandoverBackend(tokenizer, handover_seed=handover_seed)
        assert play(shuffled) == expected
        assert shuffled.batch_sizes == whole.batch_sizes


def test_games_move_while_the_rest_of_their_batch_samples(tokenizer):
    """Early finishers' games take their move and get their next prompt before the batch ends."""
    policy = ShuffledHandoverBackend(tokenizer, handover_seed=3)
    matches = [MatchSpec("tictactoe", ("policy", "policy"), seed=s) for s in range(16)]
    list(RolloutEngine({"policy": policy}, RolloutSettings(concurrency=16)).run(matches))
    assert any(calls[-1] > calls[0] for calls in policy.tokenizer_calls_at_handovers)


def test_multi_turn_prompts_carry_the_players_own_chat(tokenizer):
    policy = LegalMoveBackend(tokenizer)
    matches = [MatchSpec("tictactoe", ("policy", "policy"), seed=s) for s in range(4)]
    settings = RolloutSettings(observation_mode="multi_turn")
    for trajectory in RolloutEngine({"policy": policy}, settings).run(matches):
        by_seat = {}
        for turn in trajectory.turns:
            by_seat.setdefault(turn.seat, []).append(turn)
        for turns in by_seat.values():
            for earlier, later in zip(turns, turns[1:]):
                later_prompt = tokenizer.decode(later.prompt_ids)
                assert tokenizer.decode(earlier.prompt_ids) in later_prompt
                assert earlier.text in later_prompt
                assert later_prompt.count("<|im_start|>system") == 1


def test_truncated_responses_are_invalid_moves(hf_backend, tokenizer):
    settings = RolloutSettings(sampling=SamplingSettings(max_new_tokens=2), invalid_moves=InvalidMovePolicy(retries=1))
    [trajectory] = RolloutEngine({"policy": hf_backend, "random": "random"}, settings).run(
        [MatchSpec("tictactoe", ("policy", "random"), seed=0)]
    )
    assert [t.finish_reason for t in trajectory.turns] == ["length", "length"]
    assert all(t.invalid for t in trajectory.turns)
    assert trajectory.result.end_reason == "invalid_move"
    assert trajectory.result.rewards == (-1.5, 0.5)
    assert trajectory.turns[-1].reward == -1.5
    # The retried attempt carries the penalty it would have ended the game with; the last one ended it.
    assert [t.retried_penalty for t in trajectory.turns] == [-1.5, None]


@pytest.mark.slow
def test_mixed_batch_with_a_real_backend_is_well_formed_and_reproducible(hf_backend, tokenizer):
    matches, players, settings, first = play_mixed_batch(hf_backend, tokenizer)
    assert list(RolloutEngine(players, settings).run(matches)) == first


def test_each_policy_is_asked_and_sampled_in_its_own_style(tokenizer):
    """Models trained differently meet in one engine: one asked with the state alone in one chat
    and decoding legally, the other as the engine's settings say."""
    players = {"viewer": LegalMoveBackend(tokenizer), "reader": LegalMoveBackend(tokenizer, seed=1)}
    style = RolloutSettings(sampling=SamplingSettings(decoding="legal"), observation_mode="multi_turn", prompt="view")
    seatings = [("viewer", "reader"), ("reader", "viewer")]
    matches = [MatchSpec("tictactoe", seatings[seed % 2], seed=seed) for seed in range(4)]
    engine = RolloutEngine(players, RolloutSettings(), styles={"viewer": style})
    turns = [turn for trajectory in engine.run(matches) for turn in trajectory.turns]
    viewer = [t for t in turns if t.agent == "viewer"]
    reader = [t for t in turns if t.agent == "reader"]
    assert viewer and reader and not any(t.invalid for t in turns)
    assert all(t.choices for t in viewer) and not any(t.choices for t in reader)
    for turn in viewer:
        prompt = tokenizer.decode(turn.prompt_ids)
        assert "system" not in prompt and prompt.startswith("<|im_start|>user\nYou play")
    assert max(tokenizer.decode(t.prompt_ids).count("<|im_start|>user") for t in viewer) > 1  # one chat
    for turn in reader:
        prompt = tokenizer.decode(turn.prompt_ids)
        assert prompt.startswith("<|im_start|>system") and prompt.count("<|im_start|>user") == 1


@pytest.mark.parametrize("observation_mode", ["single_turn", "multi_turn"])
def test_view_prompts_show_the_players_view_alone(tokenizer, observation_mode):
    policy = LegalMoveBackend(tokenizer)
    matches = [MatchSpec("tictactoe", ("policy", "policy"), seed=s) for s in range(4)]
    settings = RolloutSettings(
        sampling=SamplingSettings(decoding="legal"), observation_mode=observation_mode, prompt="view"
    )
    for trajectory in RolloutEngine({"policy": policy}, settings).run(matches):
        assert trajectory.result.end_reason == "game_over"
        for index, turn in enumerate(trajectory.turns):
            prompt = tokenizer.decode(turn.prompt_ids)
            assert prompt.startswith(f"<|im_start|>user\nYou play {'XO'[turn.seat]}. The board")
            assert "system" not in prompt and "Legal moves" not in prompt and "boxed" not in prompt.split("\n")[0]
            own_turns_so_far = index // 2 + 1
            expected = own_turns_so_far if observation_mode == "multi_turn" else 1
            assert prompt.count("<|im_start|>user") == expected
