"""Environment throughput with many concurrent games.

For each native game, keeps N games in flight (1,024 by default) and round-robins over them
as the rollout engine does: render the mover's observation (rules + state text), pick a
random legal move, step the environment with the answer text, and start a new game when one
ends. Prints steps per second and the split of time between prompt rendering and stepping.

    python benchmarks/env_step.py [--concurrent 1024] [--steps 30000] [--games tictactoe ...]
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np

from selfplay.games import make_env
from selfplay.games.registry import builtin_games


def measure(game: str, concurrent: int, steps: int, seed: int) -> dict:
    envs = [make_env(game) for _ in range(concurrent)]
    for i, env in enumerate(envs):
        env.reset(seed=seed + i)
    next_seed = seed + concurrent
    rng = np.random.default_rng(seed)
    render_s = step_s = 0.0
    done = prompt_chars = finished = 0
    while done < steps:
        for env in envs:
            t0 = time.perf_counter()
            obs = env.observe(env.agent_selection)
            prompt = obs["rules"] + "\n\n" + obs["state"]
            t1 = time.perf_counter()
            moves = env.legal_moves()
            env.step(env.answer(moves[rng.integers(len(moves))]))
            t2 = time.perf_counter()
            render_s += t1 - t0
            step_s += t2 - t1
            prompt_chars += len(prompt)
            done += 1
            if env.end_reason is not None:
                finished += 1
                env.reset(seed=next_seed)
                next_seed += 1
    return {
        "game": game,
        "steps_per_s": done / (render_s + step_s),
        "render_us": 1e6 * render_s / done,
        "step_us": 1e6 * step_s / done,
        "prompt_chars": prompt_chars / done,
        "games_finished": finished,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrent", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=30_000, help="steps measured per game")
    parser.add_argument("--games", nargs="+", default=builtin_games())
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    print(f"{args.concurrent} concurrent games per row, {args.steps} steps measured, random legal moves\n")
    header = f"{'game':<14} {'steps/s':>9} {'render us':>10} {'step us':>8} {'prompt chars':>13} {'games done':>11}"
    print(header)
    print("-" * len(header))
    for game in args.games:
        r = measure(game, args.concurrent, args.steps, args.seed)
        print(
            f"{r['game']:<14} {r['steps_per_s']:>9,.0f} {r['render_us']:>10.1f} {r['step_us']:>8.1f} "
            f"{r['prompt_chars']:>13,.0f} {r['games_finished']:>11,}"
        )
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak resident memory of this process: {peak_mib:,.0f} MiB")


if __name__ == "__main__":
    main()
