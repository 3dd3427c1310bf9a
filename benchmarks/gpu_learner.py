"""The sharded learner on the GPUs of this machine, with vLLM generating: a few training steps,
then each step's time split into generation, learning and weight sync, and each GPU's peak
memory (as `nvidia-smi` sees it: learner processes and the vLLM engine together).

    python benchmarks/gpu_learner.py [--model default] [--processes N] [--steps 4] [--precision bf16]

`--processes` defaults to every GPU. On one GPU the learner and vLLM share it: the engine sleeps
(frees its weights and KV cache) while the learner updates. Needs a CUDA build of torch and the
`vllm` package (`pip install -e '.[vllm]'`); CI never runs it.

With `--league N ...`, a league of LoRA adapters on one device instead, with torch and
transformers alone (no vLLM, no network, no training loop): a LoRA learner (after one update, so
that AdamW's moments are held) generates a step of Kuhn Poker turns, `--games` deals, both
seats, against itself, then against N past players of each given count, each an adapter
snapshot served over the learner's own model by the hf backend's `AdapterPool` (at most
`--resident` loaded, as league.resident_adapters). It prints, for each N, the peak and
held GPU memory and a generation step's time, each against self-play's:

    python benchmarks/gpu_learner.py --league 1 4 16 [--shape Qwen2.5-0.5B] [--rank 8] [--resident 8]
    python benchmarks/gpu_learner.py --league 1 4 --device cpu --games 8 --new-tokens 8 --repeats 1

`--shape` builds a model of that published shape (benchmarks/league_scaling.py) with random
weights and the built-in model's tokenizer and vocabulary; without it, the built-in model.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch
from league_memory import storages
from league_scaling import MODELS
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from selfplay.backends import PolicyBackend, SamplingSettings, make_backend
from selfplay.backends.hf_backend import AdapterPool, PooledAdapter
from selfplay.config import LeagueConfig, LearnerConfig, LoraConfig, load_config
from selfplay.default_model import resolve_model
from selfplay.games import make_game
from selfplay.learner import Learner, Sample
from selfplay.prompts import batch_prompt_ids
from selfplay.run_dir import RunDir
from selfplay.train import Trainer

PARTS = ("time/generate_s", "time/learn_s", "time/sync_s", "time/league_s")


class GpuMemoryPeaks:
    """The highest memory in use on each GPU, read from `nvidia-smi` every `every` seconds."""

    def __init__(self, every: float = 0.2):
        self.every = every
        self.peaks: dict[int, int] = {}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        query = ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"]
        while not self.stopped.wait(self.every):
            for line in subprocess.run(query, capture_output=True, text=True, check=True).stdout.splitlines():
                index, used = (int(field) for field in line.split(","))
                self.peaks[index] = max(self.peaks.get(index, 0), used)

    def __enter__(self) -> GpuMemoryPeaks:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join()


# -- a league of adapters ----------------------------------------------------------------------


def model_of_shape(shape: str, directory: Path, device: str) -> str:
    """A model of the published shape `shape` with random weights, and the built-in model's tokenizer
    and vocabulary, saved in `directory`: real-scale layers without a download."""
    default = resolve_model("default")
    vocabulary = AutoConfig.from_pretrained(default)
    fields = {key: value for key, value in MODELS[shape].items() if key != "vocab_size"}
    tokens = {key: getattr(vocabulary, key) for key in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id")}
    config = AutoConfig.for_model(**fields, **tokens)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config = GenerationConfig.from_pretrained(default)
    model.save_pretrained(directory)
    AutoTokenizer.from_pretrained(default).save_pretrained(directory)
    return str(directory)


def kuhn_prompts(tokenizer, deals: int) -> list[list[int]]:
    """Both seats' first prompts of `deals` Kuhn Poker deals (rules, then the seat's view)."""
    conversations = []
    for deal in range(deals):
        game = make_game("kuhn_poker")
        game.reset(np.random.default_rng(deal))
        for seat in range(game.num_players):
            conversations.append(
                [{"role": "system", "content": game.rules}, {"role": "user", "content": game.describe(seat)}]
            )
    return batch_prompt_ids(tokenizer, conversations)


def past_players(learner: Learner, count: int, directory: Path) -> list[Path]:
    """`count` adapter snapshots of `learner`, each its adapter with random weights of its own."""
    generator = torch.Generator().manual_seed(0)
    adapters = [p for name, p in learner.model.named_parameters() if "lora_" in name]
    snapshots = []
    for index in range(count):
        with torch.no_grad():
            for weight in adapters:
                weight.copy_(0.02 * torch.randn(weight.shape, generator=generator))
        snapshots.append(learner.export_adapter(directory / f"past{index}"))
    return snapshots


def generation_step(learning: PolicyBackend, opponents: list[PolicyBackend], prompts, sampling, device: str) -> float:
    """Seconds for one step's turns, in one batch: self-play (no opponents) generates every seat
    with the learning policy; a league the learning seat's with it and the other seat's with each
    opponent in turn, each row with its own adapter (`generate_rows`, as the rollout engine asks)."""
    start = time.perf_counter()
    if not opponents:
        learning.generate(prompts, sampling)
    else:
        policies = [learning if i % 2 == 0 else opponents[i // 2 % len(opponents)] for i in range(len(prompts))]
        for _ in learning.generate_rows(policies, prompts, sampling):
            pass
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def league_of_adapters(args: argparse.Namespace) -> None:
    device = args.device
    cuda = device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("No GPU: run the league of adapters with --device cpu (a tiny model), or on a GPU machine.")
    with tempfile.TemporaryDirectory() as scratch:
        path = resolve_model(args.model) if args.shape is None else model_of_shape(args.shape, Path(scratch), device)
        config = LearnerConfig(precision=args.precision, lora=LoraConfig(rank=args.rank, target_modules=args.targets))
        learner = Learner(path, config, device=device)
        learning = make_backend("hf", path, device=device, model=learner.model)
        prompts = kuhn_prompts(learning.tokenizer, args.games)
        sampling = SamplingSettings(max_new_tokens=args.new_tokens)
        generations = learning.generate(prompts, sampling)
        learner.update(
            [
                Sample(tuple(prompt), g.token_ids, g.logprobs, advantage=1.0 if i % 2 else -1.0)
                for i, (prompt, g) in enumerate(zip(prompts, generations))
            ]
        )
        snapshots = past_players(learner, max(args.league), Path(scratch) / "snapshots")
        pool = AdapterPool(learner.model, args.resident)
        past = [
            make_backend(
                "hf", path, device=device, model=learner.model, frozen=True, adapter=PooledAdapter(pool, f"past{i}", d)
            )
            for i, d in enumerate(snapshots)
        ]
        rows = []
        for count in [0, *sorted(set(args.league) - {0})]:
            opponents = past[:count]
            generation_step(learning, opponents, prompts, sampling, device)  # loads the adapters, warms up
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            seconds = statistics.mean(
                generation_step(learning, opponents, prompts, sampling, device) for _ in range(args.repeats)
            )
            peak = torch.cuda.max_memory_allocated() if cuda else None
            rows.append((count, len(pool.resident), sum(storages(learner.model).values()), peak, seconds))
    print_league_rows(args, device, rows)


def print_league_rows(args: argparse.Namespace, device: str, rows: list[tuple]) -> None:
    model = args.shape or args.model
    print(
        f"model {model}, LoRA rank {args.rank} on {', '.join(args.targets)}, learner {args.precision}, on {device}; "
        f"{args.games} deals, both seats, {args.new_tokens} new tokens; at most {args.resident} adapters resident"
    )
    _, _, self_play_held, self_play_peak, self_play_seconds = rows[0]
    print("past players  resident  held MiB  held vs self-play  peak GiB  peak vs self-play  step s  vs self-play")
    for count, resident, held, peak, seconds in rows:
        peak_cells = ("-", "-") if peak is None else (f"{peak / 2**30:.2f}", f"{peak / self_play_peak - 1:+.1%}")
        print(
            f"{count:<12}  {resident:<8}  {held / 2**20:<8.1f}  {held / self_play_held - 1:<+17.1%}  "
            f"{peak_cells[0]:<8}  {peak_cells[1]:<17}  {seconds:<6.3f}  {seconds / self_play_seconds:.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--processes", type=int, default=torch.cuda.device_count())
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    parser.add_argument("--games", type=int, default=64, help="games per step")
    league = parser.add_argument_group("a league of adapters (--league)")
    league.add_argument("--league", type=int, nargs="+", metavar="N", help="past players per measurement")
    league.add_argument("--device", default="cuda")
    league.add_argument("--shape", choices=sorted(MODELS), help="a model of this shape, random weights")
    league.add_argument("--rank", type=int, default=8)
    league.add_argument("--targets", nargs="+", default=list(LoraConfig().target_modules), help="LoRA's modules")
    league.add_argument("--resident", type=int, default=LeagueConfig().resident_adapters, help="adapters loaded")
    league.add_argument("--new-tokens", type=int, default=32, help="tokens each turn generates at most")
    league.add_argument("--repeats", type=int, default=3, help="timed generation steps per league size")
    args = parser.parse_args()
    if args.league:
        league_of_adapters(args)
        return
    if not torch.cuda.is_available():
        raise SystemExit("No GPU: this script measures the sharded learner on GPUs.")
    with tempfile.TemporaryDirectory() as run_dir:
        config = load_config(
            "configs/quickstart.yaml",
            [
                f"model={args.model}",
                f"run_dir={run_dir}",
                f"steps={args.steps}",
                f"checkpoint_every={args.steps}",
                "max_minutes=null",
                "eval.every=0",
                "backend=vllm",
                f"backend_precision={args.precision}",
                f"learner.precision={args.precision}",
                f"learner.processes={args.processes}",
                f"rollout.games_per_step={args.games}",
            ],
        )
        with GpuMemoryPeaks() as memory:
            Trainer(config, progress=False).run()
        events = EventAccumulator(str(RunDir(run_dir).tensorboard))
        events.Reload()
        times = {part: [event.value for event in events.Scalars(part)][1:] for part in PARTS}  # step 1 compiles
    step = statistics.mean(sum(values) for values in zip(*times.values()))
    print(
        f"model {args.model}, {args.processes} learner processes on {torch.cuda.device_count()} GPUs, {args.precision}"
    )
    print(f"step {step:.2f} s: " + ", ".join(f"{p.split('/')[1]} {statistics.mean(v):.2f} s" for p, v in times.items()))
    print(f"weight sync: {statistics.mean(times['time/sync_s']) / step:.1%} of a step")
    for index, used in sorted(memory.peaks.items()):
        print(f"GPU {index}: peak {used / 1024:.1f} GiB in use")


if __name__ == "__main__":
    main()
