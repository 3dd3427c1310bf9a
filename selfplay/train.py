"""`selfplay train`: self-play training of one shared policy, one step at a time.

Each step: pick the step's matches (games and opponents by their config weights, the learner's
seat alternating) -> the rollout engine plays them, batching every pending turn of the
policy -> the learner's turns get role-conditioned advantages -> the learner updates -> the
new weights go to the generation backend -> metrics go to TensorBoard and the progress bar,
and a checkpoint is written every `checkpoint_every` steps.

Everything random derives from `seed` and the step number (and the checkpointed torch random
state), so a run resumed after a crash replays the steps it lost exactly as they would have been.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import yaml
from tqdm import tqdm

from selfplay.advantages import advantage_stats, estimate
from selfplay.agents import make_agent
from selfplay.backends import SamplingSettings, make_backend
from selfplay.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from selfplay.config import TrainConfig, config_to_dict, load_config
from selfplay.default_model import resolve_model
from selfplay.errors import UserError
from selfplay.evaluation.evaluate import plan_pairings, play_opponents
from selfplay.evaluation.exploitability import SUPPORTED_GAMES, policy_exploitability
from selfplay.games import InvalidMovePolicy, make_game
from selfplay.learner import Learner, Sample
from selfplay.records import Trajectory
from selfplay.rollouts import MatchSpec, RolloutEngine, RolloutSettings

LEARNER = "learner"
SELF = "self"
CONFIG_FILE = "config.yaml"
GROUPED_ESTIMATORS = ("grpo", "dr_grpo", "rloo")


def validate(config: TrainConfig) -> None:
    """Check what the schema cannot: that games and opponents exist and fit together."""
    for game in config.games:
        twin = make_game(game)
        for opponent in config.opponents:
            if opponent != SELF:
                make_agent(opponent, twin, seed=0)
    if config.advantages.estimator in GROUPED_ESTIMATORS and config.advantages.group_size < 2:
        raise UserError(
            f"advantages.estimator={config.advantages.estimator} compares plays of the same game start: "
            "set advantages.group_size to 2 or more."
        )
    for name in ("games_per_step", "concurrency", "max_new_tokens"):
        if getattr(config.rollout, name) < 1:
            raise UserError(f"rollout.{name} must be at least 1.")
    if config.rollout.games_per_step % config.advantages.group_size:
        raise UserError("rollout.games_per_step must be a multiple of advantages.group_size.")
    if config.learner.epochs < 1 or config.learner.minibatches < 1:
        raise UserError("learner.epochs and learner.minibatches must be at least 1.")
    if config.eval.every:
        if config.eval.episodes < 1:
            raise UserError("eval.episodes must be at least 1.")
        eval_pairings(config)


def eval_pairings(config: TrainConfig) -> dict[str, list[str]]:
    """The (game, fixed opponent) pairings evaluated every `eval.every` steps."""
    pairings, _ = plan_pairings(config.eval.games or list(config.games), config.eval.opponents)
    return pairings


def step_matches(config: TrainConfig, step: int) -> list[MatchSpec]:
    """The step's games: game and opponent drawn by weight, the learner's seat alternating,
    each game start played `group_size` times."""
    rng = np.random.default_rng([config.seed, step])
    games, game_weights = zip(*config.games.items())
    opponents, opponent_weights = zip(*config.opponents.items())
    game_p = np.array(game_weights) / sum(game_weights)
    opponent_p = np.array(opponent_weights) / sum(opponent_weights)
    seats_of = {game: make_game(game).num_players for game in games}
    starts = config.rollout.games_per_step // config.advantages.group_size
    matches = []
    for index in range(starts):
        game = games[rng.choice(len(games), p=game_p)]
        opponent = opponents[rng.choice(len(opponents), p=opponent_p)]
        seats = seats_of[game]
        players = tuple(LEARNER if opponent == SELF or seat == index % seats else opponent for seat in range(seats))
        seed = int(rng.integers(2**31))
        matches += [MatchSpec(game, players, seed)] * config.advantages.group_size
    return matches


def learner_view(trajectory: Trajectory) -> Trajectory:
    """The trajectory with only the learner's turns: the opponents' are not trained on."""
    return dataclasses.replace(trajectory, turns=tuple(t for t in trajectory.turns if t.agent == LEARNER))


def rollout_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Return per game and role and overall, outcomes against each opponent, invalid moves, lengths."""
    returns: dict[str, list[float]] = defaultdict(list)
    outcomes: dict[str, Counter] = defaultdict(Counter)
    turns = [t for trajectory in trajectories for t in trajectory.turns if t.agent == LEARNER]
    for trajectory in trajectories:
        result = trajectory.result
        for seat, label in enumerate(result.players):
            if label != LEARNER:
                continue
            returns[f"return/{result.game}/player_{seat}"].append(result.rewards[seat])
            opponents = {p for p in result.players if p != LEARNER}
            if opponents:
                reward = result.rewards[seat]
                outcome = "win" if reward > 0 else "loss" if reward < 0 else "draw"
                outcomes[f"{result.game}/{opponents.pop()}"][outcome] += 1
    metrics = {name: float(np.mean(values)) for name, values in returns.items()}
    metrics["reward/mean"] = float(np.mean([r for values in returns.values() for r in values]))
    for pairing, counts in outcomes.items():
        total = sum(counts.values())
        for outcome in ("win", "draw", "loss"):
            metrics[f"vs/{pairing}/{outcome}"] = counts[outcome] / total
    if turns:
        metrics["turns/invalid_rate"] = sum(t.invalid for t in turns) / len(turns)
        metrics["turns/response_tokens"] = float(np.mean([len(t.response_ids) for t in turns]))
        metrics["turns/per_step"] = float(len(turns))
    return metrics


class Trainer:
    def __init__(self, config: TrainConfig, *, resume: bool = False, progress: bool = True):
        validate(config)
        self.config = config
        self.eval_pairings = eval_pairings(config) if config.eval.every else {}
        self.run_dir = Path(config.run_dir)
        self.progress = progress
        model_path = resolve_model(config.model)
        checkpoint = None
        if resume:
            checkpoint = latest_checkpoint(self.run_dir)
        elif list_checkpoints(self.run_dir):
            raise UserError(
                f"'{self.run_dir}' already holds checkpoints. Continue it with `selfplay train --resume "
                f"{self.run_dir}`, or choose another run_dir."
            )
        self.learner = Learner(
            model_path,
            config.learner,
            temperature=config.rollout.temperature,
            token_sum_length=config.rollout.max_new_tokens,
            device=config.device,
            seed=config.seed,
            resume_from=checkpoint,
        )
        self.step = 0
        self.baselines: dict = {}
        if checkpoint is not None:
            state = load_checkpoint(checkpoint, self.learner)
            self.step = state["step"]
            self.baselines = {tuple(key): value for key, value in state["baselines"]}
        else:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / CONFIG_FILE).write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
        self.backend = make_backend(config.backend, str(checkpoint or model_path))
        self.backend.version = self.step
        self.sync_path = self.run_dir / "sync" / "policy.safetensors"
        self.sync_path.parent.mkdir(parents=True, exist_ok=True)
        from torch.utils.tensorboard import SummaryWriter

        # purge_step drops anything a killed run logged after its last checkpoint.
        self.writer = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=self.step + 1)
        rollout = config.rollout
        self.rollout_settings = RolloutSettings(
            sampling=SamplingSettings(
                max_new_tokens=rollout.max_new_tokens, temperature=rollout.temperature, top_p=rollout.top_p
            ),
            observation_mode=rollout.observation_mode,
            max_turns=rollout.max_turns,
            invalid_moves=InvalidMovePolicy(
                retries=rollout.retries,
                penalty=rollout.invalid_penalty,
                opponent_reward=rollout.invalid_opponent_reward,
            ),
            concurrency=rollout.concurrency,
        )

    def run(self) -> dict[str, float]:
        """Train to `config.steps`; returns the last step's metrics."""
        metrics: dict[str, float] = {}
        bar = tqdm(total=self.config.steps, initial=self.step, desc="train", unit="step", disable=not self.progress)
        deadline = time.monotonic() + 60 * self.config.max_minutes if self.config.max_minutes else math.inf
        try:
            while self.step < self.config.steps:
                self.step += 1
                metrics = self.train_step()
                if self.config.eval.every and self.step % self.config.eval.every == 0:
                    metrics.update(self.evaluate())
                self._log(metrics)
                bar.update(1)
                bar.set_postfix(
                    reward=f"{metrics.get('reward/mean', 0):+.2f}",
                    invalid=f"{metrics.get('turns/invalid_rate', 0):.2f}",
                    tok_s=f"{metrics.get('time/tokens_per_s', 0):.0f}",
                )
                out_of_time = time.monotonic() > deadline
                if self.step % self.config.checkpoint_every == 0 or self.step == self.config.steps or out_of_time:
                    self.save()
                if out_of_time:
                    break
        finally:
            bar.close()
            self.writer.close()
            self.backend.close()
        return metrics

    def train_step(self) -> dict[str, float]:
        config = self.config
        started = time.perf_counter()
        sampling = dataclasses.replace(
            self.rollout_settings.sampling,
            seed=int(np.random.SeedSequence([config.seed, self.step]).generate_state(1)[0]),
        )
        players = {LEARNER: self.backend, **{o: o for o in config.opponents if o != SELF}}
        engine = RolloutEngine(players, dataclasses.replace(self.rollout_settings, sampling=sampling))
        trajectories = list(engine.run(step_matches(config, self.step)))
        generated = time.perf_counter()

        learned = [learner_view(t) for t in trajectories]
        advantages, self.baselines = estimate(
            config.advantages.estimator, learned, self.baselines, decay=config.advantages.decay
        )
        samples = [
            Sample(turn.prompt_ids, turn.response_ids, turn.logprobs, advantage)
            for trajectory, values in zip(learned, advantages)
            for turn, advantage in zip(trajectory.turns, values)
        ]
        learner_stats = self.learner.update(samples)
        updated = time.perf_counter()

        self.backend.load_weights(self.learner.export_weights(self.sync_path), version=self.step)
        synced = time.perf_counter()

        metrics = rollout_metrics(trajectories)
        metrics.update({f"advantage/{k}": v for k, v in advantage_stats(advantages).items()})
        metrics.update({f"learner/{k}": v for k, v in learner_stats.items()})
        tokens = sum(len(t.response_ids) for r in trajectories for t in r.turns)
        metrics["time/generate_s"] = generated - started
        metrics["time/learn_s"] = updated - generated
        metrics["time/sync_s"] = synced - updated
        metrics["time/tokens_per_s"] = tokens / max(generated - started, 1e-9)
        return metrics

    def evaluate(self) -> dict[str, float]:
        """The current policy against the fixed opponents of `config.eval` (the same deals
        every time), and its exact exploitability in the small games; the figures of
        `selfplay eval`, as `eval/...` metrics."""
        started = time.perf_counter()
        rows = play_opponents(
            self.backend, self.eval_pairings, self.config.eval.episodes, self.config.seed, self.rollout_settings
        )
        metrics = {}
        for row in rows:
            for name in ("wins_rate", "draws_rate", "losses_rate", "invalid_move_rate", "mean_response_tokens"):
                metrics[f"eval/{row['game']}/{row['opponent']}/{name}"] = row[name]
        for game in (g for g in self.eval_pairings if g in SUPPORTED_GAMES):
            with self.learner.scoring_model() as model:
                metrics[f"eval/{game}/exploitability"] = policy_exploitability(model, self.learner.tokenizer, game)
        metrics["time/eval_s"] = time.perf_counter() - started
        return metrics

    def save(self) -> Path:
        state = {"baselines": [[list(key), value] for key, value in self.baselines.items()]}
        return save_checkpoint(self.run_dir, self.step, self.learner, state, keep=self.config.keep_checkpoints)

    def _log(self, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            if math.isfinite(value):
                self.writer.add_scalar(name, value, self.step)
        self.writer.flush()


def train_command(config_path: str | None, overrides: list[str], resume: str | None, progress: bool = True) -> dict:
    """What `selfplay train` runs: a new run from a config, or a resumed one from its run dir
    (with its saved config, and any overrides on top, e.g. a larger `steps`)."""
    if resume is not None:
        saved = Path(resume) / CONFIG_FILE
        if not saved.exists():
            raise UserError(f"'{resume}' is not a run directory: it has no {CONFIG_FILE}.")
        config = load_config(saved, [*overrides, f"run_dir={resume}"])
    else:  # without a file, the schema's defaults
        config = load_config(config_path, overrides)
    return Trainer(config, resume=resume is not None, progress=progress).run()
