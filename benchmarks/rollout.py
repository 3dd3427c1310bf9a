"""Rollout efficiency: how close the rollout engine keeps the generator to its bare speed.

Plays self-play games with the default model through the rollout engine, recording every
batch the engine sends to the backend. Then replays exactly those batches (same prompts,
same sampling seeds, so the same tokens) straight through the backend. Both start from an
empty prefix cache. The ratio of the two token rates is the rollout efficiency: 1.0 means
game stepping, prompt rendering and tokenization cost nothing next to generation, or run
entirely while the backend samples. The same figure for one game at a time is the baseline
to beat, and a run with 1,024 games in flight gives the peak memory.

    python benchmarks/rollout.py --backend hf [--concurrent 256] [--episodes 512]
"""

from __future__ import annotations

import argparse
import resource
import time

from selfplay.backends import SamplingSettings, make_backend
from selfplay.default_model import resolve_model
from selfplay.games import InvalidMovePolicy
from selfplay.rollouts import MatchSpec, RolloutEngine, RolloutSettings


class RecordingBackend:
    """Passes batches through to a backend and keeps every batch asked for and its token count."""

    def __init__(self, backend):
        self.backend = backend
        self.tokenizer = backend.tokenizer
        self.calls = []
        self.tokens = 0

    def generate_as_completed(self, prompts, sampling, choices=None):
        self.calls.append((prompts, sampling))
        for finished in self.backend.generate_as_completed(prompts, sampling, choices):
            self.tokens += sum(len(generation.token_ids) for _, generation in finished)
            yield finished


def rollout(backend, games, episodes, concurrency, sampling, retries, seed=0):
    backend.clear_prefix_cache()
    recorder = RecordingBackend(backend)
    matches = [MatchSpec(games[i % len(games)], ("policy", "policy"), seed + i) for i in range(episodes)]
    settings = RolloutSettings(sampling=sampling, concurrency=concurrency, invalid_moves=InvalidMovePolicy(retries))
    start = time.perf_counter()
    trajectories = list(RolloutEngine({"policy": recorder}, settings).run(matches))
    seconds = time.perf_counter() - start
    return recorder, seconds, trajectories


def replay(backend, calls):
    # The rollout started from an empty prefix cache; so does its replay, which would otherwise
    # find every prompt it sends already computed.
    backend.clear_prefix_cache()
    start = time.perf_counter()
    tokens = sum(len(g.token_ids) for prompts, sampling in calls for g in backend.generate(prompts, sampling))
    return tokens, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--model", default="default")
    parser.add_argument("--games", nargs="+", default=["tictactoe", "kuhn_poker", "connect_four", "nim"])
    parser.add_argument("--concurrent", type=int, default=256)
    parser.add_argument("--episodes", type=int, default=512)
    parser.add_argument("--sequential-episodes", type=int, default=16)
    parser.add_argument("--memory-concurrent", type=int, default=1024)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--retries", type=int, default=0, help="attempts after an invalid move, to lengthen games")
    args = parser.parse_args()

    backend = make_backend(args.backend, resolve_model(args.model))
    sampling = SamplingSettings(max_new_tokens=args.max_new_tokens, temperature=1.0)
    rollout(backend, args.games, 8, 8, sampling, args.retries)  # warm-up

    print(
        f"backend {args.backend}, model {args.model}, games {', '.join(args.games)}, self-play, "
        f"max {args.max_new_tokens} new tokens, {args.retries} retries\n"
    )
    rows = []
    for label, concurrency, episodes in (
        (f"{args.concurrent} games in flight", args.concurrent, args.episodes),
        ("one game at a time", 1, args.sequential_episodes),
    ):
        recorder, seconds, trajectories = rollout(backend, args.games, episodes, concurrency, sampling, args.retries)
        bare_tokens, bare_seconds = replay(backend, recorder.calls)
        assert bare_tokens == recorder.tokens, "replay must regenerate the same tokens"
        turns = sum(len(t.turns) for t in trajectories)
        mean_batch = turns / len(recorder.calls)
        rows.append((label, recorder.tokens / seconds, bare_tokens / bare_seconds, mean_batch, turns))
    best_bare = rows[0][2]
    header = (
        f"{'rollout':<22} {'rollout tok/s':>14} {'bare tok/s':>11} {'efficiency':>11} "
        f"{'vs batched bare':>16} {'mean batch':>11}"
    )
    print(header)
    print("-" * len(header))
    for label, rollout_rate, bare_rate, mean_batch, _ in rows:
        print(
            f"{label:<22} {rollout_rate:>14,.0f} {bare_rate:>11,.0f} {rollout_rate / bare_rate:>11.3f} "
            f"{rollout_rate / best_bare:>16.3f} {mean_batch:>11.1f}"
        )
    print(f"\n{rows[0][0]} / one game at a time: {rows[0][1] / rows[1][1]:.2f}x the tokens/s (target: 3x)")

    rollout(backend, args.games, args.memory_concurrent, args.memory_concurrent, sampling, args.retries)
    backend.close()  # engine processes report their peak once they have exited
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"\npeak memory with {args.memory_concurrent} games in flight: this process {own:,.0f} MiB", end="")
    print(f", largest engine process {children:,.0f} MiB" if children else "")


if __name__ == "__main__":
    main()
