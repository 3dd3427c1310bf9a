"""Throughput of the code sandbox: runs per second of small proposer-style programs, one at a
time and through `verify_many`'s thread pool, in the bubblewrap jail and in the unsafe child
process (the audit hook alone), measured in one invocation, with their ratio, and the jail's
one-off set-up time.

    python benchmarks/sandbox.py [--runs 60] [--workers 16]
"""

from __future__ import annotations

import argparse
import time

from selfplay.roles.sandbox import SEEDS, Sandbox

PROGRAMS = [
    ("def f(x):\n    return sorted(x)[::-1]", "[3, 1, 2]"),
    ("def f(x):\n    return sum(i * i for i in range(x))", "7"),
    ("def f(x):\n    return x.upper() + x[::-1]", "'cat'"),
    ("def f(x):\n    return {k: len(k) for k in x}", "['a', 'bcd']"),
]


def throughput(sandbox: Sandbox, runs: int, workers: int) -> tuple[float, float, float]:
    """Runs per second one at a time and through verify_many (a run a seed), and the mean
    start-up cost per run in milliseconds."""
    for source, argument in PROGRAMS:  # warm the page cache
        sandbox.run(source, "f", argument)
    sandbox.metrics()
    started = time.perf_counter()
    for i in range(runs):
        source, argument = PROGRAMS[i % len(PROGRAMS)]
        sandbox.run(source, "f", argument)
    sequential = runs / (time.perf_counter() - started)
    start_ms = sandbox.metrics().get("sandbox/start_ms", float("nan"))
    tasks = [(source, "f", argument) for source, argument in PROGRAMS] * max(1, runs // (2 * len(PROGRAMS)))
    started = time.perf_counter()
    sandbox.verify_many(tasks, workers)
    concurrent = len(SEEDS) * len(tasks) / (time.perf_counter() - started)
    return sequential, concurrent, start_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--workers", type=int, default=16)
    args = parser.parse_args()
    started = time.perf_counter()
    jailed = Sandbox(isolation="bubblewrap")
    print(f"jail set-up (once per process): {time.perf_counter() - started:.2f} s")
    figures = {name: throughput(sandbox, args.runs, args.workers) for name, sandbox in
               (("bubblewrap", jailed), ("unsafe", Sandbox(isolation="unsafe")))}  # fmt: skip
    print(f"{'isolation':<12}{'runs/s, one at a time':>24}{'runs/s, verify_many':>22}{'start-up ms/run':>18}")
    for name, (sequential, concurrent, start_ms) in figures.items():
        print(f"{name:<12}{sequential:>24.1f}{concurrent:>22.1f}{start_ms:>18.1f}")
    (jail_seq, jail_conc, _), (unsafe_seq, unsafe_conc, _) = figures["bubblewrap"], figures["unsafe"]
    print(f"bubblewrap / unsafe: {jail_seq / unsafe_seq:.2f} one at a time, {jail_conc / unsafe_conc:.2f} concurrent")


if __name__ == "__main__":
    main()
