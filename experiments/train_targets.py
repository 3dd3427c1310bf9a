"""Does self-play training work? Train from a config for a time budget, then measure the
policy before and after:

- tictactoe: the non-loss rate (wins + draws) against `random`, in each seat: from games played
  at the config's temperature, and exactly (`selfplay.evaluation.exact_play`, from the
  probabilities the model gives each legal move on every board) for the policy as trained and
  for its most probable move, with each seat's losses by cause (a missed win, a missed block,
  or neither) and how often it takes a win or stops a loss one move away;
- kuhn_poker: exact exploitability of the model's policy (OpenSpiel, from the probabilities
  the model gives each legal move at every information state; uniform play is 0.458), and its
  probability of betting or calling at each of them.

    python experiments/train_targets.py configs/tictactoe.yaml --minutes 20
    python experiments/train_targets.py configs/kuhn_poker.yaml --minutes 20 [key=value ...]

The run stops after --minutes of training or at the config's `steps`, whichever comes first
(a learning-rate schedule decays across `steps`).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from selfplay.checkpoint import latest_checkpoint
from selfplay.config import RolloutConfig, load_config
from selfplay.default_model import resolve_model
from selfplay.evaluation.exact_play import exact_report
from selfplay.evaluation.exploitability import exploitability_of, move_probabilities
from selfplay.match import play_series
from selfplay.rollouts import RolloutSettings
from selfplay.scoring import pick_device
from selfplay.train import Trainer


def non_loss_vs_random(model_dir: str, game: str, episodes: int, seed: int, rollout: RolloutConfig) -> dict:
    settings = RolloutSettings.from_config(rollout)
    results = play_series(game, [f"model:{model_dir}", "random"], episodes, seed, rollout=settings, progress=False)
    figures = {}
    for seat in (0, 1):
        mine = [r for r in results if r.players[seat].startswith("model:")]
        rewards = [r.rewards[seat] for r in mine]
        figures[f"seat_{seat}"] = {
            "games": len(mine),
            "non_loss": sum(x >= 0 for x in rewards) / len(mine),
            "win": sum(x > 0 for x in rewards) / len(mine),
            "invalid_games": sum(r.invalid_moves[seat] > 0 for r in mine) / len(mine),
        }
    figures["non_loss"] = sum(f["non_loss"] * f["games"] for f in figures.values()) / episodes
    return figures


def load(model_dir: str):
    """The model (float32, for probing its probabilities; on the GPU where there is one) and its
    tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model.to(pick_device()).eval(), tokenizer


def measure(model_dir: str, games: list[str], episodes: int, seed: int, rollout: RolloutConfig) -> dict:
    """The figures of the model in `model_dir`, asked and decoded as `rollout` says."""
    figures = {}
    asked = RolloutSettings.from_config(rollout)
    for game in games:
        if game == "kuhn_poker":
            probabilities = move_probabilities(*load(model_dir), game, asked)
            figures["kuhn_poker/exploitability"] = exploitability_of(game, probabilities)
            # Each information state is its card (0 J, 1 Q, 2 K), then the moves so far (p pass, b bet).
            figures["kuhn_poker/p_bet_or_call"] = {key: round(p[1], 3) for key, p in sorted(probabilities.items())}
        if game == "tictactoe":
            figures["tictactoe/exact_vs_random"] = exact_report(*load(model_dir), game, asked)
        figures[f"{game}/vs_random"] = non_loss_vs_random(model_dir, game, episodes, seed, rollout)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--minutes", type=float, default=20.0, help="training wall-time budget")
    parser.add_argument("--episodes", type=int, default=400, help="evaluation games per game (seats alternate)")
    args = parser.parse_intermixed_args()
    config = load_config(args.config, [*args.overrides, f"max_minutes={args.minutes}"])
    games = list(config.games)
    before_dir = resolve_model(config.model)
    before = measure(before_dir, games, args.episodes, seed=12345, rollout=config.rollout)
    print(json.dumps({"before": before}, indent=1), flush=True)
    started = time.monotonic()
    last = Trainer(config).run()
    minutes = (time.monotonic() - started) / 60
    checkpoint = latest_checkpoint(config.run_dir)
    after = measure(str(checkpoint), games, args.episodes, seed=12345, rollout=config.rollout)
    summary = {"before": before, "after": after, "trained_steps": checkpoint.name, "train_minutes": minutes}
    summary["last_step"] = {k: round(v, 4) for k, v in last.items() if k.startswith(("reward/", "vs/", "time/"))}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
