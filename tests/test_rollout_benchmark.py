"""benchmarks/rollout.py: its rollout replays to the same tokens, and its breakdown accounts
for the rollout's time without counting a second twice."""

import time

from benchmarks.rollout import Stopwatch, batch_shapes, replay, rollout
from selfplay.backends import SamplingSettings, make_backend
from selfplay.rollouts import RolloutEngine


def test_nested_sections_count_each_second_once():
    stopwatch = Stopwatch()
    with stopwatch.section("outer"):
        time.sleep(0.02)
        with stopwatch.section("inner"):
            time.sleep(0.03)
    assert 0.02 <= stopwatch.seconds["outer"] < 0.03
    assert stopwatch.seconds["inner"] >= 0.03


def test_a_rollout_and_its_replays_give_the_same_tokens_and_its_sections_fit_in_its_time(tiny_model_dir):
    backend = make_backend("hf", str(tiny_model_dir))
    sampling = SamplingSettings(max_new_tokens=4, temperature=1.0)
    recorder, seconds, sections, trajectories = rollout(backend, ["tictactoe", "kuhn_poker"], 6, 4, sampling, 0)

    assert len(trajectories) == 6
    assert recorder.tokens == sum(len(turn.response_ids) for t in trajectories for turn in t.turns)
    assert replay(backend, recorder.calls)[0] == recorder.tokens
    assert replay(backend, recorder.calls, as_completed=True)[0] == recorder.tokens
    assert {"sampling (the backend)", "tokenizing prompts", "stepping games"} <= set(sections)
    assert sum(sections.values()) <= seconds
    assert RolloutEngine._apply.__name__ == "_apply", "the engine's methods are restored after the rollout"


def test_batch_shapes_count_a_shared_prefix_once_and_the_padding_of_uneven_rests():
    prefix = list(range(40))
    calls = [([prefix + [100], prefix + [101, 102, 103]], None)]
    shapes = batch_shapes(calls, max_batch_size=8)
    prompt_tokens = 41 + 43
    assert shapes["batches"] == 1
    assert shapes["run once as a shared prefix"] == 40 / prompt_tokens
    assert shapes["padding, as a share of prompt tokens"] == 2 / prompt_tokens
