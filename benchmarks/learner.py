"""Learner efficiency: one update of the learner against a bare update of the same model on the
same tokens.

The samples are the turns a step of self-play would learn from: every TicTacToe and Kuhn Poker
decision state's prompt (as the rollouts ask it), each answered with one of its legal moves,
with an advantage of +1 or -1 and the model's own log-probabilities as the sampler's. The
learner runs `Learner.update` on them (PPO loss, importance weights, statistics). The bare
update is what any trainer must do at least: a forward pass over each whole padded sequence,
the log-probability of the response tokens times the advantage, a backward pass, gradient
clipping and an AdamW step, in micro-batches of the same token budget. Both start from the
same weights. The ratio of their token rates is the learner's efficiency (target: at least 0.8).
The learner can exceed 1: it runs the prompts' shared prefix once per micro-batch and the
output head only where a response token is scored, where the bare update, as a plain forward
pass does, runs both over every position.

    python benchmarks/learner.py [--samples 256] [--prompt full|view] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from selfplay.config import LearnerConfig
from selfplay.default_model import resolve_model
from selfplay.evaluation.exploitability import information_states
from selfplay.learner import Learner, Sample
from selfplay.prompts import batch_prompt_ids
from selfplay.scoring import response_logprobs


def turns(learner: Learner, count: int, prompt: str, seed: int) -> list[Sample]:
    """`count` samples drawn from the decision states of TicTacToe and Kuhn Poker."""
    tokenizer = learner.tokenizer
    states = [s for game in ("tictactoe", "kuhn_poker") for s in information_states(game, by_state=True, prompt=prompt)]
    rng = random.Random(seed)
    chosen = rng.sample(states, count)
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
    """Forward over each padded sequence, advantage-weighted response log-probability, backward,
    clip, AdamW step."""
    optimizer.zero_grad(set_to_none=True)
    total = sum(len(s.response_ids) for s in samples)
    batch: list[Sample] = []

    def run(batch: list[Sample]) -> None:
        width = max(len(s.prompt_ids) + len(s.response_ids) for s in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        targets = torch.full((len(batch), width), -1, dtype=torch.long)
        weights = torch.zeros((len(batch), width))
        for row, s in enumerate(batch):
            sequence = [*s.prompt_ids, *s.response_ids]
            ids[row, : len(sequence)] = torch.tensor(sequence)
            start = len(s.prompt_ids) - 1  # the position that predicts the first response token
            targets[row, start : start + len(s.response_ids)] = torch.tensor(s.response_ids)
            weights[row, start : start + len(s.response_ids)] = s.advantage
        logits = model(input_ids=ids).logits.float()
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)
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
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--samples", type=int, default=256, help="turns in the update")
    parser.add_argument("--prompt", choices=("full", "view"), default="full")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
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


if __name__ == "__main__":
    main()
