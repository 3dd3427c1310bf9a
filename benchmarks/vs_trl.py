"""selfplay against TRL's GRPOTrainer on the same work, back to back in one invocation.

The task is single-turn with an exact reward: by default the `arithmetic` game (one expression,
1 point for its value; `--game` names another one-seat game or sets its options). Both trainers
get the same model, the same prompts in the same order (the expressions selfplay's own schedule
draws for each step, each asked with selfplay's chat prompt), the same samples per prompt, max
new tokens, temperature, learning rate, steps and loss: group-normalised advantages (GRPO), no
KL, one on-policy gradient step per batch, the loss averaged over tokens, gradients clipped at 1,
AdamW at a constant rate. Rewards in TRL are the game's own: each completion is played in the
game it was asked from.

Each trainer runs in its own process, so that each peak memory (maximum resident set) is its
own; TRL runs on CPU without vLLM, as selfplay's `hf` backend does. Printed for each: samples/s
and sampled tokens/s over whole steps (the first step left out: both load and compile then),
the split of step time between generation, the update and the rest (TRL: computing rewards;
selfplay: playing the games out, rewards and weight sync), peak memory, and the mean reward
by step; then selfplay's ratio to TRL. TRL is a benchmark-only dependency
(`pip install -e '.[bench]'`); the package never imports it.

    python benchmarks/vs_trl.py [--model default] [--game arithmetic] [--steps 8] [--prompts 8]
        [--samples 8] [--max-new-tokens 16] [--temperature 1.0] [--lr 1e-5] [--seed 0]
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import resource
import statistics
import tempfile
import time
from dataclasses import dataclass, field


@dataclass
class Figures:
    steps_s: list[float] = field(default_factory=list)  # wall time of each whole step
    generate_s: list[float] = field(default_factory=list)
    learn_s: list[float] = field(default_factory=list)  # the update itself; the rest of a step is "other"
    sampled_tokens: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    peak_rss_mib: float = 0.0


def selfplay_config(args, run_dir: str):
    from selfplay.config import load_config

    return load_config(
        None,
        [
            f"model={args.model}",
            f"run_dir={run_dir}",
            f"seed={args.seed}",
            f"steps={args.steps}",
            f"checkpoint_every={args.steps}",
            f"games={{'{args.game}': 1}}",
            "opponents={self: 1}",
            "backend=hf",
            "backend_precision=fp32",
            f"rollout.games_per_step={args.prompts * args.samples}",
            f"rollout.max_new_tokens={args.max_new_tokens}",
            f"rollout.temperature={args.temperature}",
            "rollout.prompt=full",
            "rollout.decoding=free",
            "advantages.estimator=grpo",
            f"advantages.group_size={args.samples}",
            "learner.loss=ppo",
            f"learner.lr={args.lr}",
            "learner.lr_schedule=constant",
            "learner.kl_coef=0",
            "learner.epochs=1",
            "learner.minibatches=1",
            "learner.aggregation=token_mean",
            "learner.max_grad_norm=1.0",
            "eval.every=0",
        ],
    )


def scheduled_prompts(args) -> list[dict]:
    """Every prompt selfplay's schedule asks, step by step, with the game seed it was asked from."""
    from selfplay.games import make_env
    from selfplay.league.manager import League
    from selfplay.prompts import opening_messages

    config = selfplay_config(args, "unused")  # a league of one schedules without touching its run directory
    league = League(config)
    rows = []
    for step in range(1, args.steps + 1):
        for match in league.schedule(step)[:: args.samples]:  # each start repeats `samples` times
            env = make_env(match.game)
            env.reset(seed=match.seed)
            messages = opening_messages(env.observe(env.agent_selection), config.rollout.prompt)
            rows.append({"prompt": messages, "seed": match.seed})
    return rows


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def run_selfplay(args) -> Figures:
    from selfplay.train import Trainer

    figures = Figures()
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(selfplay_config(args, run_dir), progress=False)
        for _ in range(args.steps):
            trainer.step += 1
            started = time.perf_counter()
            metrics = trainer.train_step()
            figures.steps_s.append(time.perf_counter() - started)
            figures.generate_s.append(metrics["time/generate_s"])
            figures.learn_s.append(metrics["time/learn_s"])
            figures.sampled_tokens.append(round(metrics["turns/response_tokens"] * args.prompts * args.samples))
            figures.rewards.append(metrics["reward/mean"])
        trainer.close()
    figures.peak_rss_mib = peak_rss_mib()
    return figures


def run_trl(args) -> Figures:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from selfplay.default_model import resolve_model

    reward_s = []  # time spent in game_reward, by call

    def game_reward(prompts, completions, seed, **_) -> list[float]:
        """Each completion played in the game it was asked from: the game's own reward."""
        from selfplay.games import make_env

        started = time.perf_counter()
        rewards = []
        for completion, game_seed in zip(completions, seed):
            env = make_env(args.game)
            env.reset(seed=game_seed)
            agent = env.agent_selection
            env.step(completion[-1]["content"])
            rewards.append(env.rewards[agent])
        reward_s.append(time.perf_counter() - started)
        return rewards

    torch.manual_seed(args.seed)
    path = resolve_model(args.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    figures = Figures()
    generating = []
    generate = model.generate

    def timed_generate(*a, **k):
        started = time.perf_counter()
        out = generate(*a, **k)
        generating.append(time.perf_counter() - started)
        return out

    model.generate = timed_generate

    class StepTimes(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.started = time.perf_counter()
            generating.clear()
            reward_s.clear()

        def on_step_end(self, *_, **__):
            figures.steps_s.append(time.perf_counter() - self.started)
            figures.generate_s.append(sum(generating))
            figures.learn_s.append(figures.steps_s[-1] - figures.generate_s[-1] - sum(reward_s))

        def on_log(self, _args, _state, _control, logs=None, **__):
            if logs and "reward" in logs:
                figures.rewards.append(logs["reward"])
                figures.sampled_tokens.append(round(logs["completions/mean_length"] * args.prompts * args.samples))

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=args.prompts * args.samples,
            gradient_accumulation_steps=1,
            num_generations=args.samples,
            max_completion_length=args.max_new_tokens,
            temperature=args.temperature,
            top_p=1.0,
            top_k=0,
            learning_rate=args.lr,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=1.0,
            beta=0.0,
            num_iterations=1,
            loss_type="dapo",  # the mean over every completion token of the batch
            scale_rewards="group",
            max_steps=args.steps,
            shuffle_dataset=False,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            bf16=False,
            seed=args.seed,
            disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=game_reward,
            args=config,
            train_dataset=Dataset.from_list(scheduled_prompts(args)),
            processing_class=tokenizer,
            callbacks=[StepTimes()],
        )
        trainer.remove_callback(PrinterCallback)  # the per-step log lines; the figures come at the end
        trainer.train()
    figures.peak_rss_mib = peak_rss_mib()
    return figures


def in_process(runner, args) -> Figures:
    """`runner(args)` in a fresh process: its own peak memory and no state shared."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return Figures(**pool.apply(_as_dict, (runner, args)))


def _as_dict(runner, args) -> dict:
    return dataclasses.asdict(runner(args))


def summary(name: str, figures: Figures, samples_per_step: int) -> dict[str, float]:
    timed = slice(1, None) if len(figures.steps_s) > 1 else slice(None)
    total = sum(figures.steps_s[timed])
    generate, learn = sum(figures.generate_s[timed]), sum(figures.learn_s[timed])
    row = {
        "samples_s": samples_per_step * len(figures.steps_s[timed]) / total,
        "tokens_s": sum(figures.sampled_tokens[timed]) / total,
        "step_s": statistics.mean(figures.steps_s[timed]),
    }
    print(
        f"{name:8s}  {row['samples_s']:9.2f}  {row['tokens_s']:9.1f}  {row['step_s']:7.2f}  "
        f"{generate / total:6.0%}  {learn / total:6.0%}  {1 - (generate + learn) / total:6.0%}  "
        f"{figures.peak_rss_mib:8.0f}  " + " ".join(f"{r:.2f}" for r in figures.rewards)
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default", help="a Hugging Face model name or directory")
    parser.add_argument(
        "--game", default="arithmetic", help="a one-seat game spec, e.g. 'arithmetic(format_penalty=-1)'"
    )
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt (the group)")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    samples = args.prompts * args.samples
    print(
        f"{args.game}, {args.steps} steps of {args.prompts} prompts x {args.samples} samples, "
        f"{args.max_new_tokens} new tokens at most, model {args.model}, CPU"
    )
    ours, theirs = in_process(run_selfplay, args), in_process(run_trl, args)
    print("\ntrainer   samples/s   tokens/s   step s  generate  learn  other  peak MiB  mean reward by step")
    selfplay_row = summary("selfplay", ours, samples)
    trl_row = summary("TRL", theirs, samples)
    print(
        f"\nselfplay / TRL: samples/s {selfplay_row['samples_s'] / trl_row['samples_s']:.2f}x, "
        f"tokens/s {selfplay_row['tokens_s'] / trl_row['tokens_s']:.2f}x "
        f"(first step of each left out of the rates)"
    )


if __name__ == "__main__":
    main()
