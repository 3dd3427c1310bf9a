"""`selfplay train`: self-play training of one shared policy, one step at a time.

Each step: the league picks each learning player's matches (games and opponents by their
config weights, the player's seat alternating; a run without `league.enabled` is a league of
one, the main player) -> the rollout engine plays them all at once, batching every pending
turn per policy (learners and frozen snapshots alike) -> each learning player's turns get
role-conditioned advantages -> each learner updates on its schedule -> its new weights go to
its generation backend -> the league records the results and takes its snapshots -> metrics
go to TensorBoard and the progress bar, and a checkpoint is written every `checkpoint_every`
steps.

Who plays and how each generates (learning players, snapshots, scripted agents, their backends)
is the roster's (`selfplay.roster`); the trainer asks it for each step's players.

Everything random derives from `seed` and the step number (and the checkpointed torch random
state), so a run resumed after a crash replays the steps it lost exactly as they would have been.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import math
import os
import shlex
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
import yaml
from tqdm import tqdm
from transformers.utils import logging as transformers_logging

from selfplay.advantages import advantage_stats, estimate
from selfplay.agents import make_agent
from selfplay.backends import PolicyBackend
from selfplay.checkpoint import (
    checkpoint_step,
    exploiter_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from selfplay.cleanup import close_all
from selfplay.config import TrainConfig, config_to_dict, load_config, settings_by_key
from selfplay.distributed.learner_group import LearnerProcessDied
from selfplay.errors import UserError
from selfplay.evaluation import exact_play
from selfplay.evaluation.evaluate import POLICY, plan_pairings, play_opponents
from selfplay.evaluation.exploitability import (
    SUPPORTED_GAMES,
    information_states,
    policy_exploitability,
)
from selfplay.evaluation.game_kinds import primary_figures
from selfplay.evaluation.scoreboard import game_outcome, truncation_warning
from selfplay.evaluation.training_curve import (
    ROLE_FIGURES,
    Evaluation,
    append_evaluation,
    evaluation_table,
    keep_evaluations_up_to,
    plot_learning_curve,
    read_evaluations,
)
from selfplay.files import WriteError, append_text, is_disk_full, replace_text, write_failure
from selfplay.games import make_game
from selfplay.games.base import declares_answer_grammar
from selfplay.games.registry import is_cooperative
from selfplay.league.exploiter_log import append_stops, keep_stops_up_to
from selfplay.league.exploiter_stopping import ExactCheck, exact_check, exact_check_due
from selfplay.league.manager import League, initial_players, roles_of
from selfplay.league.matchmaking import MAIN, SELF, is_fixed, is_psro, rule_error
from selfplay.league.population import snapshot_name
from selfplay.league.standings import read_league, standings_text
from selfplay.league.store import LeagueStore
from selfplay.learner import Learner, NonFiniteUpdate, Sample
from selfplay.model_specs import model_directory
from selfplay.records import Trajectory
from selfplay.roles.base import advantage_key
from selfplay.rollouts import RolloutEngine, RolloutSettings
from selfplay.roster import LearningPlayer, Roster, training_roles
from selfplay.run_dir import RunDir, RunLock
from selfplay.scoring import pick_device, warn_if_bf16_emulated
from selfplay.tracking import TrackerFailed, Trackers, installed_trackers, open_trackers

# Steps in a row in which every answer was invalid before a run warns that it has collapsed.
COLLAPSE_STEPS = 10


def opponent_mixes(config: TrainConfig) -> dict[str, dict[str, float]]:
    """Every matchmaking mix of the config, by the key that sets it."""
    league = config.league
    mixes = {"opponents": config.opponents}
    if league.enabled:
        mixes["league.main_exploiter_opponents"] = league.main_exploiter_opponents
        mixes["league.league_exploiter_opponents"] = league.league_exploiter_opponents
        mixes.update({f"league.role_opponents.{role}": mix for role, mix in league.role_opponents.items()})
    return mixes


def validate(config: TrainConfig) -> None:
    """Check what the schema cannot: that games, opponents and matchmaking rules exist and fit together."""
    fixed = list(config.league.scripted)
    for key, mix in opponent_mixes(config).items():
        for rule in mix:
            problem = rule_error(rule)
            if problem:
                raise UserError(f"Bad value for '{key}': {problem}.")
            not_two_player = [game for game in config.games if len(roles_of(game)) != 2] if is_psro(rule) else []
            if not_two_player:
                raise UserError(
                    f"'{key}' names '{rule}', whose meta-game is between two players, but {', '.join(not_two_player)} "
                    "seat more or fewer: train two-player games, or use pfsp or uniform."
                )
            if is_psro(rule) and key.endswith("exploiter_opponents") and config.league.psro_payoffs != "exact":
                raise UserError(
                    f"'{key}' names '{rule}', but an exploiter hunts a target that stays put while it trains, and "
                    "a meta-strategy from games moves as evaluation games fill its entries: set "
                    "league.psro_payoffs=exact, or give psro rules to the main player (opponents) alone."
                )
            if is_fixed(rule):
                fixed.append(rule)
            elif rule != SELF and not config.league.enabled:
                raise UserError(
                    f"'{key}' names '{rule}', which picks from the league's population: set league.enabled=true, "
                    "or use self and fixed agents only."
                )
    for game in config.games:
        twin = make_game(game)
        for spec in fixed:
            make_agent(spec, twin, seed=0)
    roles = {role for game in config.games for role in roles_of(game)}
    for role in config.league.role_opponents:
        if role not in roles:
            raise UserError(
                f"league.role_opponents names the role '{role}', which no game of this run has; its games' roles: "
                f"{', '.join(sorted(roles))}."
            )
    if config.league.enabled and config.league.exploiter_stop == "exact":
        check_exact_stopping(config)
    if config.league.enabled and config.league.psro_payoffs == "exact":
        check_exact_payoffs(config)
    if config.rollout.decoding == "legal":
        free_text = [game for game in config.games if not make_game(game).lists_every_move]
        if free_text:
            raise UserError(
                f"rollout.decoding=legal writes only listed legal moves, but {', '.join(free_text)} take free text: "
                "train those games with rollout.decoding=free, or structured where they declare an answer grammar."
            )
    if config.rollout.decoding == "structured":
        undeclared = [game for game in config.games if not declares_answer_grammar(make_game(game))]
        if undeclared:
            raise UserError(
                f"rollout.decoding=structured needs each game's answer grammar, but {', '.join(undeclared)} take free "
                "text and declare none: train those games with rollout.decoding=free."
            )
    if config.eval.every:
        eval_pairings(config)
    if config.learner.adapter_per_role:
        training_roles(config)
    installed_trackers(config.logging)
    check_device(config.device)


def check_exact_stopping(config: TrainConfig) -> None:
    """That the exact stopping rule can score the run's exploiters: one game, with an OpenSpiel
    twin small enough to probe at every information state, and exploiters matched against model
    snapshots alone."""
    league = config.league
    plateau = "use league.exploiter_stop=plateau"
    if len(config.games) != 1:
        raise UserError(
            f"league.exploiter_stop=exact scores exploiters in one game, but this run plays {', '.join(config.games)}: "
            f"{plateau}, or train one game."
        )
    try:
        information_states(next(iter(config.games)))
    except UserError as err:
        raise UserError(f"league.exploiter_stop=exact needs a best response: {err} Else {plateau}.") from None
    mixes = {"league.main_exploiter_opponents": league.main_exploiter_opponents}
    mixes["league.league_exploiter_opponents"] = league.league_exploiter_opponents
    for key, mix in mixes.items():
        fixed = [rule for rule in mix if is_fixed(rule)]
        if fixed:
            raise UserError(
                f"league.exploiter_stop=exact scores exploiters against model snapshots, but '{key}' names "
                f"{', '.join(fixed)}: drop them, or {plateau}."
            )


def check_exact_payoffs(config: TrainConfig) -> None:
    """That `league.psro_payoffs=exact` can compute every game's meta-game: each has an OpenSpiel
    twin small enough to probe at every information state."""
    for game in config.games:
        try:
            information_states(game)
        except UserError as err:
            raise UserError(
                f"league.psro_payoffs=exact computes the meta-game's payoffs from every move probability: {err} "
                "Else set league.psro_payoffs=games."
            ) from None


def check_device(device: str | None) -> None:
    """That torch knows `device` and that this machine has it."""
    if device is None:
        return
    try:
        kind = torch.device(device)
    except RuntimeError:
        raise UserError(f"Bad value for 'device': '{device}' is not a torch device; use cpu, cuda or cuda:N.") from None
    backend = getattr(torch, kind.type, None)  # torch.cuda, torch.mps, torch.xpu, torch.cpu
    if not (hasattr(backend, "is_available") and backend.is_available()):
        raise UserError(f"Bad value for 'device': this machine has no {kind.type} device that torch can use.")
    count = backend.device_count()
    if kind.type != "cpu" and kind.index is not None and kind.index >= count:
        raise UserError(f"Bad value for 'device': {device}, but this machine has {count} {kind.type} devices.")


def eval_pairings(config: TrainConfig) -> dict[str, list[str]]:
    """The (game, fixed opponent) pairings evaluated every `eval.every` steps."""
    plan = plan_pairings(config.eval.games or list(config.games), config.eval.opponents)
    if plan.models:
        raise UserError(
            f"eval.opponents names the model {', '.join(plan.models)}: a run evaluates its policy against scripted "
            "agents only. Evaluate it against a model afterwards: selfplay eval --checkpoints "
            f"{config.run_dir} --opponents {','.join(plan.models)}."
        )
    if plan.skipped:
        raise UserError(
            f"Bad value for 'eval.opponents': a run's evaluations {plan.refusal('eval.opponents', 'eval.games')}."
        )
    return plan.games


def learner_view(trajectory: Trajectory, label: str) -> Trajectory:
    """The trajectory with only the turns of `label`: the opponents' are not trained on."""
    return dataclasses.replace(trajectory, turns=tuple(t for t in trajectory.turns if t.agent == label))


def rollout_metrics(trajectories: Sequence[Trajectory], label: str = MAIN) -> dict[str, float]:
    """Return per game and role and overall, outcomes against each opponent (games stopped by a
    turn cap apart, as truncated), invalid moves, lengths, for the player `label`."""
    returns: dict[str, list[float]] = defaultdict(list)
    outcomes: dict[str, Counter] = defaultdict(Counter)
    turns = [t for trajectory in trajectories for t in trajectory.turns if t.agent == label]
    cooperative = {game: is_cooperative(game) for game in {t.result.game for t in trajectories}}
    for trajectory in trajectories:
        result = trajectory.result
        for seat, player in enumerate(result.players):
            if player != label:
                continue
            returns[f"return/{result.game}/{roles_of(result.game)[seat]}"].append(result.rewards[seat])
            opponents = sorted({p for p in result.players if p != label})
            if cooperative[result.game]:  # one shared score: no wins or losses
                returns[f"team_score/{result.game}"].append(result.rewards[seat])
            elif opponents:
                outcomes[f"{result.game}/{'+'.join(opponents)}"][game_outcome(result, seat)] += 1
    metrics = {name: float(np.mean(values)) for name, values in returns.items()}
    metrics["reward/mean"] = float(
        np.mean([r for k, values in returns.items() if k.startswith("return/") for r in values])
    )
    metrics["games/truncated_rate"] = sum(t.result.end_reason == "turn_cap" for t in trajectories) / max(
        len(trajectories), 1
    )
    for pairing, counts in outcomes.items():
        total = sum(counts.values())
        for outcome, name in (("wins", "win"), ("draws", "draw"), ("losses", "loss"), ("truncated", "truncated")):
            metrics[f"vs/{pairing}/{name}"] = counts[outcome] / total
    if turns:
        metrics["turns/invalid_rate"] = sum(t.invalid for t in turns) / len(turns)
        metrics["turns/response_tokens"] = float(np.mean([len(t.response_ids) for t in turns]))
        metrics["turns/per_step"] = float(len(turns))
    return metrics


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM (`selfplay.stopping`) stopped a training run; the message says where it
    stopped and how to go on."""


class TrainingDiverged(RuntimeError):
    """A learner's update at some step was not finite: the run stops there, keeping its last good
    checkpoint. Not a `UserError`: no setting was refused, training failed, and its traceback is kept."""


TRAINING = "train"  # the run's bar while it trains


class RunBar(tqdm):
    """The run's progress bar. Its rate and ETA count the evaluations to come as well as the
    steps, each at the mean duration of its kind so far; an evaluation describes itself on it."""

    def __init__(self, *, evaluations_left: Callable[[int], int], **kwargs):
        self.evaluations_left = evaluations_left  # after a given step and its own evaluation
        self.durations: dict[str, list[float]] = {"step": [], "evaluation": []}
        super().__init__(**kwargs)

    @contextlib.contextmanager
    def timing(self, kind: str) -> Iterator[None]:
        """Time what runs inside as one `kind` ("step" or "evaluation") on the bar's clock."""
        if self.disable:
            yield
            return
        started = self._time()
        try:
            yield
        finally:
            self.durations[kind].append(self._time() - started)

    def seconds_left(self) -> float | None:
        """The steps left and their evaluations, at the mean durations so far; None before a step is timed."""
        steps, evaluations = self.durations["step"], self.durations["evaluation"]
        if not steps or self.n >= self.total:
            return None
        evaluation = float(np.mean(evaluations)) if evaluations else 0.0
        return (self.total - self.n) * float(np.mean(steps)) + self.evaluations_left(self.n) * evaluation

    @property
    def format_dict(self) -> dict:
        figures = super().format_dict
        left = self.seconds_left()
        if left:  # tqdm's ETA is the steps left over its rate
            figures["rate"] = (self.total - self.n) / left
        return figures


class Trainer:
    def __init__(self, config: TrainConfig, *, resume: bool = False, progress: bool = True):
        validate(config)
        # Snapshots load as the league grows: transformers' loading bars would break the training bar.
        transformers_logging.disable_progress_bar()
        self.config = config
        self.eval_pairings = eval_pairings(config) if config.eval.every else {}
        self.run_dir = Path(config.run_dir)
        self.progress = progress
        # Held until `close`: no other process may train, resume or prune this run meanwhile.
        self.run_lock = RunLock(self.run_dir)
        # What the run holds besides, as `_open` opens it, and `close` releases.
        self.roster: Roster | None = None  # who plays, and the backends they generate with
        self.workers, self.started_ray = None, False  # Ray rollout workers, with `distributed.rollout_workers`
        self.league: League | None = None
        self.trackers: Trackers | None = None
        self.step = 0  # until `_open` reads the checkpoint's
        try:
            self._open(resume)
        except BaseException as err:
            self.close(failing=True)  # a sharded learner's processes and Ray's workers must not outlive the run
            stop = self._stop_error(err)
            if stop is err:
                raise
            raise stop from None

    def _open(self, resume: bool) -> None:
        """Load the run's models, league and logs: a new run's, or a resumed run's as its latest
        checkpoint left them."""
        config = self.config
        checkpoint = None
        if resume:
            checkpoint = latest_checkpoint(self.run_dir)
        elif list_checkpoints(self.run_dir):
            raise UserError(
                f"'{self.run_dir}' already holds checkpoints. Continue it with `selfplay train --resume "
                f"{self.run_dir}`, or choose another run_dir."
            )
        self.step = checkpoint_step(checkpoint) if checkpoint else 0
        if self.step > config.steps:
            raise UserError(
                f"The run in '{self.run_dir}' is at step {self.step}, past steps={config.steps}, and a resumed run "
                f"does not go back: set steps above {self.step} to continue it."
            )
        if checkpoint is not None and self.step == config.steps:
            print(
                f"Run '{self.run_dir}' is already at step {self.step} of steps={config.steps}: nothing to train. "
                "Raise steps to continue it.",
                file=sys.stderr,
            )
        self.model_path = model_directory(config.model)
        self.games = {spec: make_game(spec) for spec in config.games}  # asked for their own figures each step
        self.rollout_settings = RolloutSettings.from_config(config.rollout)
        if config.distributed.rollout_workers:
            self._start_workers()
        self.submitted = self.step  # the last step whose games were handed to the workers
        self.roster = Roster(config, self.model_path, self.run_dir, self.rollout_settings, self.workers)
        main = self.roster.add_learning_player(MAIN, checkpoint, self.step)
        if checkpoint is None:  # once the model has loaded: a run that cannot start leaves no directory
            start_run_dir(self.run_dir, config)
        else:
            report_resumed_config(self.run_dir, config, self.step)
            keep_evaluations_up_to(RunDir(self.run_dir).eval_log, self.step)
            keep_stops_up_to(RunDir(self.run_dir).exploiter_log, self.step)
        warn_if_bf16_emulated(
            {  # a backend that does not say its device (vLLM) is not checked
                "learner.precision": (config.learner.precision, main.learner.device),
                "backend_precision": (config.backend_precision, getattr(main.backend, "device", None)),
            }
        )
        self.league = self._open_league(checkpoint) if config.league.enabled else League(config)
        self.roster.league = self.league
        if checkpoint is not None:  # last, so that its random state is the one the run goes on with
            main.baselines = _baselines(load_checkpoint(checkpoint, main.learner))
        self.trackers = open_trackers(config, self.step, resume=checkpoint is not None)

    @property
    def learner(self) -> Learner:
        return self.roster.players[MAIN].learner

    @property
    def backend(self) -> PolicyBackend:
        return self.roster.players[MAIN].backend

    # -- setting up ----------------------------------------------------------------------------

    def _start_workers(self) -> None:
        from selfplay.distributed.cluster import connect
        from selfplay.distributed.worker_pool import RolloutWorkers

        config = self.config
        learner = config.learner
        on_gpus = learner.processes > 1 and torch.device(pick_device(config.device)).type == "cuda"
        self.started_ray = connect(config.distributed, learner_gpus=learner.processes if on_gpus else 0)
        self.workers = RolloutWorkers(
            config.distributed,
            str(self.model_path),
            config.backend,
            config.backend_precision,
            self.rollout_settings,
            learner_device=pick_device(config.device),
            current_weights=lambda name: self.roster.backend_weights(name),
            device=config.device,
        )

    def _open_league(self, checkpoint: Path | None) -> League:
        """The league as the store holds it at this run's step: a resumed run forgets what was
        recorded after its `checkpoint` (it replays those steps exactly) and takes its
        exploiters from it, a new run starts the league."""
        store = LeagueStore(RunDir(self.run_dir).league_store)
        store.rollback_to(self.step)
        if not store.players():
            store.add_players(initial_players(self.config))
        exact = self.roster.exact_return if self.config.league.psro_payoffs == "exact" else None
        league = League(self.config, store, exact_return=exact, target_value=self.roster.target_value)
        for player in league.learning_players():
            if player.name != MAIN:
                saved = exploiter_checkpoint(checkpoint, player.name) if checkpoint is not None else None
                exploiter = self.roster.add_learning_player(player.name, saved, self.step)
                if saved is not None:
                    state = load_checkpoint(saved, exploiter.learner)
                    exploiter.baselines = _baselines(state)
                    if state.get("best_check") is not None:
                        exploiter.best_check = ExactCheck(**state["best_check"])
        first = snapshot_name(MAIN, 0)
        if first not in league.players:
            league.add_initial_snapshot(self.roster.freeze(MAIN, first))
        return league

    # -- training ------------------------------------------------------------------------------

    def run(self) -> dict[str, float]:
        """Train to `config.steps`; returns the last step's metrics. Whatever ends the run, all it
        holds is released (`close`), and an error that stopped it is the one reported."""
        bar = RunBar(
            evaluations_left=self._evaluations_after,
            total=self.config.steps,
            initial=self.step,
            desc=TRAINING,
            unit="step",
            disable=not self.progress,
        )
        try:
            try:
                metrics = self._train(bar)
            except BaseException:
                bar.close()
                self.close(failing=True)
                raise
            bar.close()
            self.close()
        except BaseException as err:
            stop = self._stop_error(err)
            if stop is err:
                raise
            raise stop from None
        print(self._report(metrics))
        return metrics

    def _train(self, bar: RunBar) -> dict[str, float]:
        """The training loop of `run`, which `bar` shows; returns the last step's metrics."""
        metrics: dict[str, float] = {}
        deadline = time.monotonic() + 60 * self.config.max_minutes if self.config.max_minutes else math.inf
        all_invalid_steps = 0
        truncation_warned = False
        evaluating = bool(self.config.eval.every)
        bar.unpause()  # the bar's clock starts with training, not with loading the models
        if evaluating and self.config.eval.before_training and self.step == 0:
            self._log(self.evaluate(bar))
        while self.step < self.config.steps:
            self.step += 1
            with bar.timing("step"):
                metrics = self.train_step()
            if self.config.eval.every and self.step % self.config.eval.every == 0:
                metrics.update(self.evaluate(bar))
            bar.update(1)
            self._log(metrics)
            bar.set_postfix(
                reward=f"{metrics.get('reward/mean', 0):+.2f}",
                invalid=f"{metrics.get('turns/invalid_rate', 0):.2f}",
                tok_s=f"{metrics.get('time/tokens_per_s', 0):.0f}",
                **({"snapshots": int(metrics["league/snapshots"])} if "league/snapshots" in metrics else {}),
            )
            all_invalid_steps = all_invalid_steps + 1 if metrics.get("turns/invalid_rate") == 1.0 else 0
            if all_invalid_steps == COLLAPSE_STEPS:
                bar.write(collapse_warning(self.step, self.run_dir))
            games = self.config.rollout.games_per_step
            warning = truncation_warning(round(metrics["games/truncated_rate"] * games), games, "rollout.max_turns")
            if warning and not truncation_warned:
                bar.write(warning)
                truncation_warned = True
            out_of_time = time.monotonic() > deadline
            if self.step % self.config.checkpoint_every == 0 or self.step == self.config.steps or out_of_time:
                self.save()
            if out_of_time:
                break
        evaluations = read_evaluations(RunDir(self.run_dir).eval_log)
        if evaluating and (not evaluations or evaluations[-1].step != self.step):
            final = self.evaluate(bar)  # the policy the run ends with
            self._log(final)
            metrics.update(final)
        return metrics

    def _evaluations_after(self, step: int) -> int:
        """How many evaluations the run does after its `step` and that step's evaluation: one every
        `eval.every` steps, and one at the end unless the last step has one."""
        every, steps = self.config.eval.every, self.config.steps
        return steps // every - step // every + (steps % every != 0) if every else 0

    def _stop_error(self, err: BaseException) -> BaseException:
        """The error to report for `err`, which stopped the run: one line for the user's, `err` itself for a bug."""
        if failed_write(err):
            return run_stopped_by(err, self.run_dir, self.step)
        if isinstance(err, (LearnerProcessDied, TrackerFailed)):
            return UserError(f"The run stopped at step {self.step}: {str(err).rstrip('.')}. {self._resume_hint()}")
        if isinstance(err, KeyboardInterrupt):
            return RunInterrupted(f"the run stopped at step {self.step}. {self._resume_hint()}")
        return err

    def close(self, failing: bool = False) -> None:
        """Release what the run holds, each part whatever the others do (`close_all`; `failing`: an
        error of the run's own comes first): its logs, backends, league store, workers and, last,
        the run directory's lock. A run that could not open holds only some of them."""
        steps = [
            *([("closing the trackers", self.trackers.close)] if self.trackers is not None else []),
            *(self.roster.closers() if self.roster is not None else []),
            *([("closing the league store", self.league.close)] if self.league is not None else []),
            *([("stopping the rollout workers", self.workers.close)] if self.workers is not None else []),
        ]
        if self.started_ray:
            import ray

            steps.append(("shutting Ray down", ray.shutdown))
        close_all([*steps, ("releasing the run directory's lock", self.run_lock.release)], failing)

    def _report(self, metrics: dict[str, float]) -> str:
        """What a run ends with: the table of its first and last evaluations (before and after
        training), whose learning curve it draws (`learning_curve.png` in the run directory), or
        without evaluations the last step's figures (`metrics`); a league's standings; and the
        commands that look further."""
        files = RunDir(self.run_dir)
        run = shlex.quote(str(self.run_dir))
        evaluations = read_evaluations(files.eval_log)
        blocks = [f"Run {self.run_dir}: step {self.step} of {self.config.steps}."]
        if self.step < self.config.steps:  # nothing else ends a run early
            blocks[0] += f" max_minutes={self.config.max_minutes} stopped it; `selfplay train --resume {run}` goes on."
        further = []
        if evaluations:
            plot_learning_curve(evaluations, files.learning_curve)
            blocks.append(evaluation_table(evaluations))
            unprobed = [game for game in self.eval_pairings if game in exact_play.SUPPORTED_GAMES]
            if unprobed and not self._exact_play_games():
                blocks[-1] += (
                    f"\nNo exact non-loss figure for {', '.join(unprobed)}: it reads one prompt per position, and "
                    "this run plays rollout.observation_mode=multi_turn, whose prompt holds the game so far."
                )
            further.append(f"the learning curve of every evaluation: {files.learning_curve}")
        else:
            if "reward/mean" in metrics:
                blocks[0] += (
                    f" Its last step's games: mean reward {metrics['reward/mean']:+.3f}, invalid moves "
                    f"{metrics.get('turns/invalid_rate', 0):.3f}. No evaluation ran (eval.every sets one)."
                )
            games = " ".join(shlex.quote(game) for game in self.config.games)
            models, which = run, "its checkpoints"
            if self.config.learner.adapter_per_role:
                models, which = " ".join(f"{run}@{role}" for role in training_roles(self.config)), "each role's adapter"
            further.append(f"{which} against random: selfplay eval --checkpoints {models} --games {games}")
        if "reward/mean" in metrics:
            blocks += [line for game in self.config.games if (line := _roles_line(game, metrics))]
        if self.config.league.enabled:
            blocks.append(standings_text(read_league(self.run_dir)))
            meta = next((f" --meta {game}" for game in self.config.games if game in SUPPORTED_GAMES), "")
            further.append(f"the league's payoffs, lineage and meta-strategy: selfplay league show {run}{meta}")
        if self.config.logging.tensorboard:
            further.append(f"every metric by step: tensorboard --logdir {shlex.quote(str(files.tensorboard))}")
        further += tracker_runs(self.config, self.trackers.run_ids if self.trackers is not None else {})
        blocks.append("Look further:\n" + "\n".join(f"  {line}" for line in further))
        return "\n" + "\n\n".join(blocks)

    def _restart_hint(self, name: str) -> str:
        """How to go on after `name`'s update diverged: from the last checkpoint, at a lower rate."""
        exploiter_lr = name != MAIN and self.config.league.exploiter_lr is not None
        return self._resume_hint("league.exploiter_lr" if exploiter_lr else "learner.lr")

    def _resume_hint(self, lower: str | None = None) -> str:
        """How to go on from the run's last checkpoint (with the setting `lower` lowered), or,
        before its first, from the start."""
        saved = list_checkpoints(self.run_dir)
        if not saved:
            return "The run had saved no checkpoint: start it again" + (f" with a lower {lower}." if lower else ".")
        return (
            f"Its last good checkpoint, step {checkpoint_step(saved[-1])}, is kept: continue from it with "
            f"`selfplay train --resume {self.run_dir}{f' {lower}=LOWER' if lower else ''}`."
        )

    def train_step(self) -> dict[str, float]:
        config = self.config
        started = time.perf_counter()
        metrics: dict[str, float] = {}
        if self.workers is None:
            matches = self.league.schedule(self.step)
            seated = self.roster.seat(matches)
            versions = {label: player.version for label, player in seated.items() if isinstance(player, PolicyBackend)}
            engine = RolloutEngine(seated, dataclasses.replace(self.rollout_settings, sampling=self._sampling()))
            trajectories = list(engine.run(matches))
            game_metrics = {spec: game.training_metrics() for spec, game in self.games.items()}
        else:
            self._submit_ahead()
            played = self.workers.collect(self.step)
            trajectories, versions, game_metrics = played.trajectories, played.versions, played.game_metrics
            metrics.update(self._distributed_metrics(played))
        generated = time.perf_counter()

        sync_s = 0.0
        for player in self.roster.players.values():  # a vLLM engine on the learner's GPU sleeps until its sync
            player.backend.release_memory()
        for name, player in self.roster.players.items():
            owned = [t for t in trajectories if t.result.owner == name]
            learned = [learner_view(t, name) for t in owned]
            advantages, player.baselines = estimate(
                config.advantages.estimator,
                learned,
                player.baselines,
                decay=config.advantages.decay,
                key=advantage_key,
                turn_discount=config.advantages.turn_discount,
                state_prior=config.advantages.state_prior,
                valid_turn_bonus=config.advantages.valid_turn_bonus,
            )
            samples = [
                Sample(
                    turn.prompt_ids,
                    turn.response_ids,
                    turn.logprobs,
                    advantage,
                    turn.choices,
                    turn.grammar,
                    lag=player.backend.version - turn.policy_version,
                    role=turn.role,
                )
                for trajectory, values in zip(learned, advantages)
                for turn, advantage in zip(trajectory.turns, values)
            ]
            stats = rollout_metrics(owned, name)
            stats.update({f"advantage/{k}": v for k, v in advantage_stats(advantages).items()})
            try:
                update = self.step if name == MAIN else self.step - self.league.last_snapshot_step(name)
                learned_stats = player.learner.scheduled_update(samples, update, config.steps)
            except NonFiniteUpdate as err:  # raised before the diverged weights reach a backend or a checkpoint
                raise TrainingDiverged(
                    f"Training diverged at step {self.step}, in {name}'s update: {err}. {self._restart_hint(name)}"
                ) from err
            stats.update({f"learner/{k}": v for k, v in learned_stats.items()})
            synced = time.perf_counter()
            self.roster.sync(player, self.step)
            sync_s += time.perf_counter() - synced
            prefix = "" if name == MAIN else f"{name}/"
            metrics.update({f"{prefix}{k}": v for k, v in stats.items()})
        updated = time.perf_counter()
        if self.workers is not None:
            metrics["distributed/sync_mb"] = self.workers.take_published_bytes() / 2**20

        checks = self._exact_checks()
        for name, check in checks.items():
            metrics[f"{name}/exact/value"] = check.value
            metrics[f"{name}/exact/best_response_value"] = check.best_response_value
        checked = time.perf_counter()
        metrics.update(self._league_step(trajectories, versions, checks))
        for spec, figures in game_metrics.items():
            metrics.update({f"game/{spec}/{k}": v for k, v in figures.items()})
        tokens = sum(len(t.response_ids) for r in trajectories for t in r.turns)
        metrics["time/generate_s"] = generated - started
        metrics["time/learn_s"] = updated - generated - sync_s
        metrics["time/sync_s"] = sync_s
        metrics["time/league_s"] = time.perf_counter() - checked
        if checks:
            metrics["time/exact_check_s"] = checked - updated
        metrics["time/tokens_per_s"] = tokens / max(generated - started, 1e-9)
        return metrics

    def _sampling(self, step: int | None = None):
        """How the games of `step` (this one by default) sample: the rollout settings, seeded by step."""
        seed = np.random.SeedSequence([self.config.seed, self.step if step is None else step]).generate_state(1)[0]
        return dataclasses.replace(self.rollout_settings.sampling, seed=int(seed))

    def _submit_ahead(self) -> None:
        """Hand the workers every step's games up to `max_staleness` steps ahead of this one,
        each played with the newest weights at the time: none is then more than that many
        versions behind the learner that trains on it."""
        last = min(self.step + self.config.distributed.max_staleness, self.config.steps)
        while self.submitted < last:
            self.submitted += 1
            matches = self.league.schedule(self.submitted)
            snapshots = {p.name for p in self.league.snapshots()}
            for label in {label for match in matches for label in match.players} & snapshots:
                self.workers.add_snapshot(
                    label, self.roster.snapshot_weights(label), self.league.players[label].created_step
                )
            self.workers.submit(self.submitted, matches, self._sampling(self.submitted), list(self.roster.players))

    def _distributed_metrics(self, played) -> dict[str, float]:
        lags = [
            self.roster.players[turn.agent].backend.version - turn.policy_version
            for trajectory in played.trajectories
            for turn in trajectory.turns
            if turn.agent in self.roster.players
        ]
        return {
            "distributed/version_lag_mean": float(np.mean(lags)) if lags else 0.0,
            "distributed/version_lag_max": float(max(lags, default=0)),
            "distributed/worker_load_s": played.sync_s,
            "distributed/play_s": played.play_s,
            "distributed/restarts": float(played.restarts),
        }

    def _exact_checks(self) -> dict[str, ExactCheck]:
        """Under `league.exploiter_stop=exact`, the exact check of each exploiter due one this step,
        after its update: its policy against the mixture its mix draws now, beside a best response's."""
        league = self.config.league
        if not league.enabled or league.exploiter_stop != "exact":
            return {}
        game = next(iter(self.config.games))
        checks = {}
        for player in self.league.learning_players():
            steps_since = self.step - self.league.last_snapshot_step(player.name)
            due = exact_check_due(steps_since, league.exploiter_check_every, league.exploiter_max_steps)
            if player.name == MAIN or not due:
                continue
            target = self.league.target_weights(player, game)
            if not target:  # a mix of self-play alone has no target to score against
                continue
            policies = self.roster.learning_policy(player.name, game), self.roster.mixture_policy(game, target)
            checks[player.name] = exact_check(game, *policies)
        return checks

    def _best_checks(self, checks: Mapping[str, ExactCheck]) -> dict[str, ExactCheck]:
        """Under `league.exploiter_keep_best`, each checked exploiter's best check since its restart,
        whose weights its learner keeps (and its snapshot is frozen with); else `checks`."""
        if not self.config.league.exploiter_keep_best:
            return dict(checks)
        for name, check in checks.items():
            player = self.roster.players[name]
            if player.best_check is None or check.value > player.best_check.value:
                player.best_check = check
                player.learner.keep_weights()
        return {name: self.roster.players[name].best_check for name in checks}

    def _league_step(
        self, trajectories: Sequence[Trajectory], versions: dict[str, int], checks: dict[str, ExactCheck]
    ) -> dict[str, float]:
        """Record the step in the league (with the step's exact checks); log the exploiters it
        froze, restart them, unload retired snapshots. Returns the league's metrics."""
        changes = self.league.record_step(
            self.step, trajectories, versions, self.roster.freeze, self._best_checks(checks), self.roster.value_against
        )
        append_stops(RunDir(self.run_dir).exploiter_log, changes.stops)
        for name in changes.resets:
            self.roster.restart_exploiter(name, self.step)
        self.roster.retire(changes.retired)
        return self.league.metrics(changes)

    def evaluate(self, bar: RunBar) -> dict[str, float]:
        """The current policy against the fixed opponents of `config.eval` (the same deals
        every time), and its exact exploitability in the small games; the figures of
        `selfplay eval` that judge play in each game's kind (`primary_figures`: win rates, or
        mean return), as `eval/...` metrics. `bar` shows what it is doing, and times it."""
        with bar.timing("evaluation"):
            metrics = self._evaluate(bar)
        bar.set_description_str(TRAINING)
        return metrics

    def _evaluate(self, bar: RunBar) -> dict[str, float]:
        started = time.perf_counter()
        episodes = self.config.eval.episodes
        played: Counter = Counter()
        where = f"eval at step {self.step}"

        def finished(trajectory: Trajectory, players) -> None:
            pairing = trajectory.result.game, next(label for label in players if label != POLICY)
            played[pairing] += 1
            bar.set_description_str(f"{where}: {pairing[0]} vs {pairing[1]}, {played[pairing]}/{episodes} games")

        rows = play_opponents(
            self.backend, self.eval_pairings, episodes, self.config.seed, self.rollout_settings, on_game=finished
        )
        metrics, intervals = {}, {}
        for row in rows:
            extras = ("truncated_rate", "invalid_move_rate", "mean_response_tokens")
            figures = {**primary_figures(row), **{k: row[k] for k in extras}}
            for name, value in figures.items():
                metrics[f"eval/{row['game']}/{row['opponent']}/{name}"] = value
                interval = row.get(f"{name.removesuffix('_rate')}_ci95")
                if interval is not None:
                    intervals[f"eval/{row['game']}/{row['opponent']}/{name}"] = tuple(interval)
            for name, figure in row["role_figures"].items():
                key = f"eval/{row['game']}/{row['opponent']}/{ROLE_FIGURES}/{name}"
                metrics[key] = figure["mean"]
                if figure["ci95"] is not None:
                    intervals[key] = tuple(figure["ci95"])
        tokenizer, rollout = self.learner.tokenizer, self.rollout_settings

        def probing(what: str) -> Callable[[int, int], None]:
            return lambda scored, total: bar.set_description_str(f"{where}: {what}, {scored}/{total} answers scored")

        exploitability_games = [g for g in self.eval_pairings if g in SUPPORTED_GAMES]
        exact_play_games = self._exact_play_games()
        # Only where a game is probed: a run of one adapter per role has no one model to probe.
        probed = exploitability_games or exact_play_games
        with self.learner.scoring_model() if probed else contextlib.nullcontext() as model:
            for game in exploitability_games:
                probe = probing(f"{game}, exact exploitability")
                metrics[f"eval/{game}/exploitability"] = policy_exploitability(model, tokenizer, game, rollout, probe)
            for game in exact_play_games:
                probe = probing(f"{game}, exact non-loss")
                seats = exact_play.exact_non_loss(model, tokenizer, game, rollout, probe)
                metrics[f"eval/{game}/exact_non_loss"] = sum(seats) / len(seats)
                metrics.update({f"eval/{game}/exact_non_loss_seat_{seat}": value for seat, value in enumerate(seats)})
        append_evaluation(RunDir(self.run_dir).eval_log, Evaluation(self.step, metrics, intervals))
        metrics["time/eval_s"] = time.perf_counter() - started
        return metrics

    def _exact_play_games(self) -> list[str]:
        """The evaluated games whose exact non-loss figure reads the policy as played: single-turn
        play only (`exact_play.state_probabilities`)."""
        if self.config.rollout.observation_mode != "single_turn":
            return []
        return [game for game in self.eval_pairings if game in exact_play.SUPPORTED_GAMES]

    def save(self) -> Path:
        """The step's checkpoint: the main player's, with every exploiter's inside it, so that a
        resumed run takes all of them from the same step."""
        players = self.roster.players
        exploiters = {name: (p.learner, _state(p)) for name, p in players.items() if name != MAIN}
        main = players[MAIN]
        return save_checkpoint(
            self.run_dir, self.step, main.learner, _state(main), self.config.keep_checkpoints, exploiters
        )

    def _log(self, metrics: dict[str, float]) -> None:
        self.trackers.log(metrics, self.step)


def start_run_dir(run_dir: Path, config: TrainConfig) -> None:
    """Make the run directory of a new run and write its config there. An earlier attempt that
    saved no checkpoint may have left a league store: the new run's league starts afresh."""
    files = RunDir(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        for stale in [
            *files.league_store_files(),
            files.eval_log,
            files.exploiter_log,
            files.learning_curve,
            files.config_history,
        ]:
            stale.unlink(missing_ok=True)
        replace_text(files.config, yaml.safe_dump(config_to_dict(config), sort_keys=False), "the run's config")
    except (OSError, WriteError) as err:
        reason = err.reason if isinstance(err, WriteError) else err.strerror
        raise UserError(f"Cannot make the run directory '{run_dir}': {reason}. Choose another run_dir.") from None


def failed_write(err: BaseException) -> bool:
    """Whether `err` is a file of the run that could not be written: a WriteError, or a full
    disk wherever it struck (TensorBoard's log, the league's store)."""
    return isinstance(err, WriteError) or is_disk_full(err)


def run_stopped_by(err: BaseException, run_dir: Path, step: int) -> UserError:
    """The message of a run that a failed write stopped at `step`: resume it, or, before its first
    checkpoint, start it again."""
    failure = err if isinstance(err, WriteError) else write_failure("the run's files", run_dir, err)
    then = (
        f"continue with `selfplay train --resume {run_dir}`"
        if list_checkpoints(run_dir)
        else "start it again (it saved no checkpoint)"
    )
    fix = "Free space on that disk (or lower keep_checkpoints)" if failure.disk_full else "Make it writable"
    return UserError(
        f"{failure} The run stopped at step {step}; nothing half-written was left and its saved checkpoints are "
        f"whole. {fix}, then {then}."
    )


def report_resumed_config(run_dir: Path, config: TrainConfig, step: int) -> None:
    """Say which config a resumed run goes on with. Settings its overrides changed are written
    back to the run's config, which the next resume reads, and each change is appended, with the
    step it took effect after, to the run's config history."""
    files = RunDir(run_dir)
    saved, now = settings_by_key(load_config(files.saved_config())), settings_by_key(config)
    # run_dir is where the run is found now, not a setting: a moved run is the same run.
    changes = {key: [saved[key], value] for key, value in now.items() if saved[key] != value and key != "run_dir"}
    if not changes:
        print(f"Resuming '{run_dir}' at step {step} with its config ({files.config}).", file=sys.stderr)
        return
    now_time = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    record = {"step": step, "time": now_time, "changes": changes}
    append_text(files.config_history, json.dumps(record, default=str) + "\n", "the run's config history")
    replace_text(files.config, yaml.safe_dump(config_to_dict(config), sort_keys=False), "the run's config")
    shown = "; ".join(f"{key}: {before!r} -> {after!r}" for key, (before, after) in changes.items())
    print(
        f"Resuming '{run_dir}' at step {step} with its config, changed by this resume: {shown}. Saved to "
        f"{files.config}, so that later resumes keep it; {files.config_history} lists every change.",
        file=sys.stderr,
    )


def tracker_runs(config: TrainConfig, run_ids: dict[str, str]) -> list[str]:
    """Where the W&B and MLflow runs that logged this run (`run_ids`, by tracker) are seen."""
    lines = []
    wandb, mlflow = config.logging.wandb, config.logging.mlflow
    if "wandb" in run_ids:
        offline = (wandb.mode or os.environ.get("WANDB_MODE", "online")) in ("offline", "dryrun")
        where = (
            f"upload it with wandb sync {shlex.quote(str(RunDir(config.run_dir).path / 'wandb'))}/offline-run-*"
            if offline
            else "at wandb.ai"
        )
        lines.append(f"the W&B run {run_ids['wandb']} in project {wandb.project}: {where}")
    if "mlflow" in run_ids:
        uri = mlflow.tracking_uri
        where = (
            f"at {uri}"
            if uri.startswith(("http://", "https://"))
            else f"mlflow ui --backend-store-uri {shlex.quote(uri)}"
        )
        lines.append(f"the MLflow run {run_ids['mlflow']} in experiment {mlflow.experiment}: {where}")
    return lines


def collapse_warning(step: int, run_dir: Path) -> str:
    return (
        f"warning: every answer of steps {step - COLLAPSE_STEPS + 1}-{step} was invalid. Every return is then "
        "the same, so the advantages vanish and the policy cannot learn its way back. Train again from a "
        f"checkpoint before the collapse (model={RunDir(run_dir).checkpoints}/step-N) with a lower learner.lr or a "
        "learner.kl_coef above 0."
    )


def _state(player: LearningPlayer) -> dict:
    best = dataclasses.asdict(player.best_check) if player.best_check is not None else None
    return {"baselines": [[list(key), value] for key, value in player.baselines.items()], "best_check": best}


def _roles_line(game: str, metrics: Mapping[str, float]) -> str | None:
    """What each role of a role game did in the last step's games: its mean return, and the
    figures the game logs about itself (attack success, solver accuracy, ...); None for a game
    without roles."""
    roles = make_game(game).roles
    if not roles:
        return None
    # A role may hold several seats (proposer_solver's solvers); it is named once.
    returns = [
        f"{role} {metrics[key]:+.3f}" for role in dict.fromkeys(roles) if (key := f"return/{game}/{role}") in metrics
    ]
    prefix = f"game/{game}/"
    figures = [f"{name.removeprefix(prefix)} {value:.3f}" for name, value in metrics.items() if name.startswith(prefix)]
    return f"{game}, its last step by role: mean return {', '.join(returns)}" + (
        f"; {', '.join(figures)}." if figures else "."
    )


def _baselines(state: dict) -> dict:
    return {tuple(key): value for key, value in state["baselines"]}


def train_command(config_path: str | None, overrides: list[str], resume: str | None, progress: bool = True) -> dict:
    """What `selfplay train` runs: a new run from a config, or a resumed one from its run dir
    (with its saved config, and any overrides on top, e.g. a larger `steps`)."""
    if resume is not None:
        config = load_config(RunDir(resume).saved_config(), [*overrides, f"run_dir={resume}"])
    else:  # without a file, the schema's defaults
        config = load_config(config_path, overrides)
    return Trainer(config, resume=resume is not None, progress=progress).run()
