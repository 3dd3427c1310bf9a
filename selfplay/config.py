"""Training configuration: plain YAML files in `configs/`, dotted `key=value` overrides, and
validation of every key and value before any work starts.

The schema is the dataclasses below; their fields, defaults and ranges are the documentation of
what a config may say. A config file only needs the keys it changes.
"""

from __future__ import annotations

import dataclasses
import math
import reprlib
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml

from selfplay.advantages import Estimator
from selfplay.errors import UserError

# The largest count or step a setting takes: a C int, which every library below reads.
MAX_COUNT = 2**31 - 1
MAX_SEED = 2**32 - 1  # a 32-bit seed, which every random generator here takes
MAX_EPISODES = 1_000_000  # games per evaluation pairing: their seeds are drawn up front
# A config is a few kilobytes; these bound what a file or an override may make the loader
# build, so that a YAML alias bomb ("billion laughs") is refused rather than expanded.
MAX_CONFIG_BYTES = 1 << 20
MAX_YAML_NODES = 10_000
MAX_YAML_DEPTH = 32


@dataclass(frozen=True)
class Bounds:
    """The values a number setting may take: from `low` to `high`, each end included unless
    `low_open` or `high_open` leaves it out."""

    low: float
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        low = f"above {self.low}" if self.low_open else f"at least {self.low}"
        if self.high == math.inf:
            return low
        if not (self.low_open or self.high_open):
            return f"from {self.low} to {self.high}"
        return f"{low} and {'below' if self.high_open else 'at most'} {self.high}"


# A plain `int` field is a count from 0 to MAX_COUNT; a `float` field names its range, and is finite.
AtLeastOne = Annotated[int, Bounds(1, MAX_COUNT)]
NonNegative = Annotated[float, Bounds(0)]
Positive = Annotated[float, Bounds(0, low_open=True)]
Fraction = Annotated[float, Bounds(0, 1)]
Weight = Annotated[float, Bounds(0, 10**6)]  # a matchmaking weight; a mapping of them needs a positive sum
LearningRate = Annotated[float, Bounds(0, 1)]  # AdamW moves each weight by about this much a step
Reward = Annotated[float, Bounds(-1000, 1000)]


@dataclass(frozen=True)
class RolloutConfig:
    games_per_step: AtLeastOne = 64  # games played per training step
    concurrency: AtLeastOne = 256  # games in flight at once
    observation_mode: Literal["single_turn", "multi_turn"] = "single_turn"
    # full: the rules, the state, the legal moves and the answer instruction; view: the state
    # alone, for small models that learn the game from rewards (see selfplay.prompts)
    prompt: Literal["full", "view"] = "full"
    # a game reaching this many moves is truncated (reported apart from draws); null: the game's own maximum length
    max_turns: AtLeastOne | None = None
    max_new_tokens: AtLeastOne = 32  # per turn; a response cut off here is an invalid move
    temperature: NonNegative = 1.0  # 0 is greedy
    top_p: Annotated[float, Bounds(0, 1, low_open=True)] = 1.0
    # legal: write only answers naming a legal move (action masking); structured: only answers of the
    # form each game declares, content free (selfplay.structured_decoding)
    decoding: Literal["free", "legal", "structured"] = "free"
    retries: int = 0  # re-asks after an invalid move before it ends the game
    invalid_penalty: Reward = -1.5  # SPIRAL's training values
    invalid_opponent_reward: Reward = 0.5
    # added to invalid_penalty when the output marks an answer (e.g. \\boxed{...}) that is no legal
    # move: a reward for the format alone, for a model that starts writing no legal move at all
    format_credit: Reward = 0.0

    def __post_init__(self):
        if self.decoding != "free" and self.top_p < 1:
            raise UserError(
                f"rollout.top_p applies to free decoding only: with rollout.decoding={self.decoding} leave it at 1."
            )


GROUPED_ESTIMATORS = ("grpo", "dr_grpo", "rloo")


@dataclass(frozen=True)
class AdvantageConfig:
    estimator: Estimator = "rae"
    decay: Fraction = 0.95  # RAE's baseline decay
    # RAE only: baseline each turn on the batch's other plays of the same prompt, shrunk towards
    # the role's baseline as if it were this many more plays; null keeps one baseline per role.
    state_prior: NonNegative | None = None
    # a turn's advantage times this ** (its player's later turns in the game)
    turn_discount: Annotated[float, Bounds(0, 1, low_open=True)] = 1.0
    group_size: AtLeastOne = 1  # plays of each game start per step; grpo, dr_grpo and rloo need more than 1
    valid_turn_bonus: Reward = 0.0  # turn_level only: MARS's reward for each valid turn (theirs: 0.05)

    def __post_init__(self):
        if self.estimator in GROUPED_ESTIMATORS and self.group_size < 2:
            raise UserError(
                f"advantages.estimator={self.estimator} compares plays of the same game start: "
                "set advantages.group_size to 2 or more."
            )
        if self.state_prior is not None and self.estimator != "rae":
            raise UserError(
                f"advantages.state_prior={self.state_prior} needs advantages.estimator=rae; set it to null otherwise."
            )
        if self.valid_turn_bonus and self.estimator != "turn_level":
            raise UserError(
                f"advantages.valid_turn_bonus={self.valid_turn_bonus} needs advantages.estimator=turn_level; "
                "set it to 0 otherwise."
            )


@dataclass(frozen=True)
class LoraConfig:
    rank: int = 0  # 0 trains every weight; above 0 trains LoRA adapters of this rank (peft)
    alpha: Positive = 16.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])

    def __post_init__(self):
        if not self.target_modules:
            raise UserError("learner.lora.target_modules must name at least one module, e.g. [q_proj, v_proj].")


@dataclass(frozen=True)
class LearnerConfig:
    loss: Literal["ppo", "reinforce"] = "ppo"
    lr: LearningRate = 1e-5
    # The learning rate over the run: constant, or decaying to 0 across `steps`, linearly or on a
    # cosine, after `warmup_steps` of linear warm-up. A run stopped by max_minutes stops mid-decay.
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = 0
    weight_decay: Fraction = 0.0  # AdamW's, decoupled: each step scales the weights by 1 - lr * this
    epochs: AtLeastOne = 1  # passes over each step's samples
    minibatches: AtLeastOne = 1  # optimizer steps per epoch
    micro_batch_tokens: AtLeastOne = 16384  # tokens per forward/backward; gradients accumulate across them
    clip: Positive = 0.2  # PPO ratio clip
    aggregation: Literal["seq_mean_token_mean", "token_mean", "token_sum"] = "token_mean"
    # token_sum divides by this many tokens per sequence (Dr.GRPO); null uses rollout.max_new_tokens.
    token_sum_length: AtLeastOne | None = None
    kl_coef: NonNegative = 0.0  # penalty towards the KL reference (the initial policy); 0 loads no reference
    # The magnet: every this many steps the KL reference moves towards the current policy, so that
    # the penalty damps self-play's cycling without holding the policy near its start for good
    # (R-NaD, magnetic mirror descent). 0 keeps the initial policy. With LoRA the reference is a
    # second, frozen adapter over the same base. How each schedule fares: docs/experiments/kuhn-poker-magnet.md.
    reference_update_every: int = 0
    # How far each move takes the reference: 1 makes it the current policy (R-NaD's reset); below 1
    # it moves that fraction of the way, weight by weight, so that moving every step (1) at a small
    # rate is MMD's moving magnet, an exponential average of the policy's weights.
    reference_update_rate: Annotated[float, Bounds(0, 1, low_open=True)] = 1.0
    # constant: kl_coef at every step; linear: from kl_coef down to 0 over the run (an annealed magnet).
    kl_schedule: Literal["constant", "linear"] = "constant"
    entropy_coef: NonNegative = 0.0  # bonus for the entropy of each response token's distribution
    # truncated importance sampling between sampler and learner: no token weighs more than this
    importance_clip: Annotated[float, Bounds(1)] | None = 2.0
    max_grad_norm: Positive = 1.0
    precision: Literal["fp32", "bf16"] = "fp32"
    lora: LoraConfig = LoraConfig()
    # In a role game (secret keeping's attacker and defender, proposer and solver): one LoRA
    # adapter per role over one frozen base, each trained on its own role's turns and saved apart
    # (checkpoints/step-N/adapters/ROLE/, loaded as RUN_DIR@ROLE); false trains one shared policy.
    adapter_per_role: bool = False
    # Processes the learner runs as, one GPU each where there are GPUs: each update is
    # data-parallel over them, and the weights, gradients and optimizer state are sharded across
    # them (FSDP2). 1 is one process, unsharded. What each setting below costs: docs/scaling.md.
    processes: AtLeastOne = 1
    # Recompute each decoder layer's activations in the backward pass rather than keep them:
    # about a third more compute, activations of one layer rather than all.
    activation_checkpointing: bool = False
    # With processes above 1 on GPUs: keep the sharded weights, gradients and optimizer state in
    # CPU memory, and run the optimizer step there (slower steps, much less GPU memory).
    offload: bool = False

    def __post_init__(self):
        if self.offload and self.processes == 1:
            raise UserError(
                "learner.offload moves the sharded learner's state to CPU memory: set learner.processes above 1, "
                "or learner.offload=false."
            )
        if self.adapter_per_role and self.lora.rank == 0:
            raise UserError(
                "learner.adapter_per_role trains a LoRA adapter for each role over one frozen base: set "
                "learner.lora.rank above 0 (e.g. 8), or learner.adapter_per_role=false."
            )
        if self.processes > 1 and self.lora.rank > 0:
            raise UserError(
                "learner.processes shards a full fine-tune; LoRA adapters are small enough for one process: set "
                "learner.lora.rank=0, or learner.processes=1."
            )
        if self.reference_update_every and self.kl_coef <= 0:
            raise UserError(
                "learner.reference_update_every moves the reference of the KL penalty, which learner.kl_coef=0 "
                "turns off: set learner.kl_coef above 0 (e.g. 0.5), or learner.reference_update_every=0."
            )
        if self.reference_update_rate < 1 and not self.reference_update_every:
            raise UserError(
                "learner.reference_update_rate is how far each move of the KL reference goes, and "
                "learner.reference_update_every=0 never moves it: set learner.reference_update_every (e.g. 1), "
                "or learner.reference_update_rate=1."
            )
        if self.kl_schedule != "constant" and self.kl_coef <= 0:
            raise UserError(
                f"learner.kl_schedule={self.kl_schedule} anneals learner.kl_coef, which is 0: set learner.kl_coef "
                "above 0, or learner.kl_schedule=constant."
            )


@dataclass(frozen=True)
class EvalConfig:
    every: int = 0  # steps between evaluations of the current policy; 0 never evaluates
    games: list[str] = field(default_factory=list)  # empty: the training games
    opponents: list[str] = field(default_factory=lambda: ["random"])  # fixed opponents, both seats
    episodes: Annotated[int, Bounds(1, MAX_EPISODES)] = 32  # games per game and opponent
    # Also evaluate the initial policy (step 0), so that a run ends with a before/after table.
    before_training: bool = True


@dataclass(frozen=True)
class LeagueConfig:
    """A population beyond the main player: its snapshots, exploiters and scripted agents, with a
    payoff table, ratings and a store in the run directory (see `selfplay/league/`)."""

    enabled: bool = False
    scripted: list[str] = field(default_factory=list)  # agent specs in the population, e.g. [random, "mcts:50"]
    main_exploiters: int = 0  # each trains only against the main player
    league_exploiters: int = 0  # each trains against the whole population
    main_exploiter_opponents: dict[str, Weight] = field(default_factory=lambda: {"main": 1.0})
    league_exploiter_opponents: dict[str, Weight] = field(default_factory=lambda: {"pfsp:hard": 1.0})
    # Role -> opponent mix for a seat of that role, in place of the learning player's own mix.
    role_opponents: dict[str, dict[str, Weight]] = field(default_factory=dict)
    exploiter_lora_rank: int = 8  # exploiters train LoRA adapters of this rank on the initial model; 0: whole models
    # What an exploiter restarts from after each snapshot: the initial model (AlphaStar), or the
    # main player's weights of that moment (it then starts from the main player's play and has
    # only its holes to find; whole-model exploiters only: exploiter_lora_rank=0).
    exploiter_init: Literal["initial", "main"] = "initial"
    exploiter_lr: LearningRate | None = None  # null: learner.lr (LoRA adapters usually want a larger one)
    # An exploiter's KL penalty towards the initial model under its adapters; null: learner.kl_coef.
    # A best response may lie far from the initial policy: 0 lets an exploiter go all the way.
    exploiter_kl_coef: NonNegative | None = None
    # How an exploiter decides it has found its target's weakness and is frozen
    # (selfplay/league/exploiter_stopping.py): snapshot, the snapshot rule below as the main player;
    # exact, its exact value against its target reaches exploiter_stop_fraction of a best
    # response's (games with an OpenSpiel twin OpenSpiel solves: kuhn_poker, leduc_holdem, ...);
    # plateau, a one-sided test says its score against its target stopped rising.
    exploiter_stop: Literal["snapshot", "exact", "plateau"] = "snapshot"
    exploiter_stop_fraction: Fraction = 0.9
    # Steps between exact checks, each a probe of the exploiter at every information state: with the
    # default model on one CPU thread 0.3 s in Kuhn Poker, 12 s in Leduc Hold'em, where a step of
    # configs/kuhn_league.yaml's games takes 5.5 s and 78 s: every 5 steps costs Leduc 3%.
    exploiter_check_every: AtLeastOne = 5
    exploiter_plateau_games: Annotated[int, Bounds(2, MAX_COUNT)] = 1024  # games in each block the test compares
    exploiter_plateau_gain: NonNegative = 0.03  # the score gain a block that counts as still rising
    exploiter_plateau_false_stop: Annotated[float, Bounds(0, 1, low_open=True, high_open=True)] = 0.05
    exploiter_max_steps: AtLeastOne = 200  # with exact or plateau: frozen after this many steps in any case
    # PSRO's best-response oracle, made steadier (docs/experiments/kuhn-poker-psro-oracle.md), each under
    # the exact rule: an exploiter frozen with its best checked weights rather than its last;
    exploiter_keep_best: bool = False
    # playing (exploiter_games_at_value / v)^2 times rollout.games_per_step games a step (from 1 to
    # exploiter_max_games_scale times), v being a best response's value against its target: the
    # closer the target is to an equilibrium, the fainter the signal, and the more games it needs;
    exploiter_games_at_value: Positive | None = None
    exploiter_max_games_scale: Annotated[float, Bounds(1, MAX_COUNT)] = 8.0
    # its KL penalty pulling it towards the initial model, or towards the weights it restarted
    # from (`start`: the main player's of that moment, with exploiter_init=main);
    exploiter_reference: Literal["initial", "start"] = "initial"
    # and once frozen, its snapshot admitted to the population always, or only if its exact value
    # against the mixture its mix draws from the population as it stands then (for a psro rule,
    # the meta-strategy of the moment) is above 0; a snapshot not admitted is retired at once.
    exploiter_admit: Literal["always", "beats_mixture"] = "always"
    snapshot_every: int = 0  # steps between snapshots of a learning player; 0: by win rate and cap only
    snapshot_win_rate: Fraction = 0.7  # snapshot once its win rate against every player it meets exceeds this
    snapshot_min_games: NonNegative = 8.0  # decayed games against a player before that win rate counts
    snapshot_max_steps: int = 50  # a snapshot at least this often; 0 for no cap
    population_cap: int = 32  # active snapshots at most; 0 for no cap
    # A LoRA learner's snapshots are adapters, served over the main learner's model: at most this
    # many held in memory at once (the least recently used unloaded, and loaded again when next met).
    resident_adapters: AtLeastOne = 8
    payoff_decay: Fraction = 0.99  # per result between two players (AlphaStar's decayed counts)
    # psro:SOLVER rules: where the meta-game's payoffs come from (selfplay/league/meta_game.py).
    # games: each pair of past players plays psro_min_games games (evaluation games, trained on by
    # no one) before a new one joins; exact: each pair's expected return, computed from their move
    # probabilities at every information state (games with an OpenSpiel twin: kuhn_poker,
    # leduc_holdem, ...), every snapshot joining at once and no game played to measure it.
    psro_payoffs: Literal["games", "exact"] = "games"
    psro_min_games: AtLeastOne = 256

    def __post_init__(self):
        if self.exploiter_init == "main" and self.exploiter_lora_rank:
            raise UserError(
                "league.exploiter_init=main restarts exploiters from the main player's whole weights, which LoRA "
                "adapters on the initial model cannot hold: set league.exploiter_lora_rank=0."
            )
        exact_only = {
            "league.exploiter_keep_best=true": self.exploiter_keep_best,
            "league.exploiter_games_at_value": self.exploiter_games_at_value is not None,
            "league.exploiter_admit=beats_mixture": self.exploiter_admit == "beats_mixture",
        }
        for setting, chosen in exact_only.items():
            if chosen and self.exploiter_stop != "exact":
                raise UserError(
                    f"{setting} needs the exact values of exploiters against their targets, which only "
                    f"league.exploiter_stop=exact computes (it has {self.exploiter_stop}): set it, or drop {setting}."
                )
        if self.exploiter_reference == "start" and self.exploiter_init != "main":
            raise UserError(
                "league.exploiter_reference=start pulls an exploiter towards the weights it restarted from, which "
                "are the initial model's unless league.exploiter_init=main: set that, or "
                "league.exploiter_reference=initial."
            )
        if self.exploiter_stop == "exact" and (self.scripted or self.role_opponents):
            raise UserError(
                "league.exploiter_stop=exact scores exploiters against model snapshots only, but league.scripted or "
                "league.role_opponents seats other players: use league.exploiter_stop=plateau, or drop them."
            )
        if self.psro_payoffs == "exact" and self.scripted:
            raise UserError(
                "league.psro_payoffs=exact reads every past player's move probabilities from its model, but "
                f"league.scripted adds {', '.join(self.scripted)}: drop them, or set league.psro_payoffs=games."
            )
        # A pair's decayed counts approach 1 / (1 - decay) games and never pass it.
        remembered = math.inf if self.payoff_decay == 1 else 1 / (1 - self.payoff_decay)
        if self.snapshot_min_games >= remembered:
            raise UserError(
                f"league.snapshot_min_games={self.snapshot_min_games:g} can never be reached: with "
                f"league.payoff_decay={self.payoff_decay:g} a pair's decayed counts stay below {remembered:.4g} games. "
                "Lower it, or raise league.payoff_decay."
            )
        learning_players = 1 + self.main_exploiters + self.league_exploiters
        if self.enabled and 0 < self.population_cap < learning_players:
            raise UserError(
                f"league.population_cap={self.population_cap} is below the {learning_players} learning players, "
                "each of whose newest snapshot stays: raise it, or set 0 for no cap."
            )


@dataclass(frozen=True)
class DistributedConfig:
    """Rollouts in Ray actors, on this machine or a cluster (see `selfplay/distributed/`). With
    no rollout workers the run plays its games in this process and never imports Ray."""

    rollout_workers: int = 0  # Ray actors that play each step's games; 0 plays them here
    address: str | None = None  # a Ray cluster to join ("auto", "HOST:PORT"); null: RAY_ADDRESS, else a local one
    worker_cpus: Positive = 1.0  # CPUs each rollout worker asks Ray for (its torch threads)
    worker_gpus: NonNegative = 0.0  # GPUs each rollout worker asks Ray for
    # Policy versions a sample may lag the learner: 0 is on-policy; k >= 1 lets workers play the
    # next k steps while the learner updates, corrected by truncated importance sampling.
    max_staleness: int = 0
    # How new weights reach the workers, in packed buckets: through Ray's object store, or
    # broadcast from the trainer over a gloo (CPU) or NCCL (GPU) process group.
    weight_sync: Literal["object_store", "collective"] = "object_store"
    max_worker_failures: AtLeastOne = 3  # times one step's games are replayed on a new worker before the run stops

    def __post_init__(self):
        if not self.rollout_workers and (self.max_staleness or self.address or self.weight_sync != "object_store"):
            raise UserError(
                "distributed.max_staleness, distributed.address and distributed.weight_sync apply to Ray rollout "
                "workers: set distributed.rollout_workers to 1 or more."
            )


@dataclass(frozen=True)
class WandbConfig:
    """A Weights & Biases run beside TensorBoard, with the run's config (pip install 'selfplay[trackers]')."""

    project: str | None = None  # the W&B project the run logs to; null: no W&B
    entity: str | None = None  # the W&B user or team; null: the logged-in user's default
    # offline keeps the run in RUN_DIR/wandb for `wandb sync`; null: WANDB_MODE, else online
    mode: Literal["online", "offline"] | None = None

    def __post_init__(self):
        if self.project is None and (self.entity is not None or self.mode is not None):
            raise UserError("logging.wandb.entity and logging.wandb.mode need logging.wandb.project: set it too.")


@dataclass(frozen=True)
class MlflowConfig:
    """An MLflow run beside TensorBoard, with the run's config as its params (pip install 'selfplay[trackers]')."""

    # where MLflow keeps its runs: a database (sqlite:///mlflow.db) or a server (http://HOST:5000); null: no MLflow
    tracking_uri: str | None = None
    experiment: str = "selfplay"

    def __post_init__(self):
        if self.tracking_uri is None and self.experiment != "selfplay":
            raise UserError("logging.mlflow.experiment needs logging.mlflow.tracking_uri: set it too.")


@dataclass(frozen=True)
class LoggingConfig:
    """Where each step's scalars go, under the same names in each (see selfplay/tracking.py)."""

    tensorboard: bool = True  # RUN_DIR/tensorboard
    wandb: WandbConfig = WandbConfig()
    mlflow: MlflowConfig = MlflowConfig()
    # When W&B or MLflow fails mid-run (its server gone, its store's disk full): continue trains on
    # without it, saying so once and, at the end, which steps it missed; stop stops the run.
    on_tracker_failure: Literal["continue", "stop"] = "continue"


@dataclass(frozen=True)
class TrainConfig:
    run_dir: str = "runs/quickstart"
    seed: Annotated[int, Bounds(0, MAX_SEED)] = 0
    model: str = "default"  # a model spec (selfplay.model_specs): a hub name or directory, default, a run, ...
    backend: Literal["hf", "vllm"] = "hf"
    # The generating backends' weights; bf16 samples faster on CPUs with bfloat16 instructions
    # and on GPUs. The learner keeps fp32 weights whatever this says (see learner.precision).
    backend_precision: Literal["fp32", "bf16"] = "fp32"
    device: str | None = None  # learner device, e.g. cpu, cuda, cuda:1; null picks cuda when present
    steps: AtLeastOne = 100
    max_minutes: Positive | None = None  # stop (with a checkpoint) after the step that passes this wall time
    games: dict[str, Weight] = field(default_factory=lambda: {"tictactoe": 1.0})  # game spec -> weight
    # Who the main player meets, by weight: "self" is its current policy; with the league,
    # "uniform", "pfsp:hard|variance|linear_capped" and "psro:nash|prd|alpharank" (its meta-strategy)
    # pick from the population; anything else is a fixed agent spec ("random", "mcts:50", "nash").
    # See selfplay/league/matchmaking.py.
    opponents: dict[str, Weight] = field(default_factory=lambda: {"self": 1.0})
    checkpoint_every: AtLeastOne = 50  # steps between checkpoints; the last step is always saved
    keep_checkpoints: AtLeastOne = 2
    rollout: RolloutConfig = RolloutConfig()
    advantages: AdvantageConfig = AdvantageConfig()
    learner: LearnerConfig = LearnerConfig()
    eval: EvalConfig = EvalConfig()
    league: LeagueConfig = LeagueConfig()
    distributed: DistributedConfig = DistributedConfig()
    logging: LoggingConfig = LoggingConfig()

    def __post_init__(self):
        if self.rollout.games_per_step % self.advantages.group_size:
            raise UserError("rollout.games_per_step must be a multiple of advantages.group_size.")
        if self.league.exploiter_reference == "start" and self.exploiter_kl_coef == 0:
            raise UserError(
                "league.exploiter_reference=start pulls exploiters towards their restart weights by their KL penalty, "
                "which is 0: set league.exploiter_kl_coef above 0, or league.exploiter_reference=initial."
            )

    @property
    def exploiter_kl_coef(self) -> float:
        """The exploiters' KL penalty: league.exploiter_kl_coef, by default the main learner's."""
        return self.learner.kl_coef if self.league.exploiter_kl_coef is None else self.league.exploiter_kl_coef


def load_config(path: str | Path | None, overrides: list[str] = ()) -> TrainConfig:
    """The config in the YAML file at `path` (defaults where it is silent) with `key=value`
    overrides applied; raises UserError naming the first bad key or value."""
    raw: dict[str, Any] = {}
    if path is not None:
        raw = read_yaml(path, "config") or {}
        if not isinstance(raw, dict):
            raise UserError(f"The config '{path}' must be a mapping of keys to values.")
    for override in overrides:
        key, sep, value = override.partition("=")
        if not sep or not key:
            raise UserError(f"Override '{override}' must look like key=value, e.g. learner.lr=1e-5.")
        _set_dotted(raw, key.strip(), parse_yaml(value, f"Override '{override}'") if value.strip() else None)
    return build_section(TrainConfig, raw, prefix="")


def config_to_dict(config) -> dict:
    return dataclasses.asdict(config)


def settings_by_key(section, prefix: str = "") -> dict:
    """Every setting of a config (section) by its dotted key, as overrides name it ("learner.lr")."""
    settings = {}
    for setting in dataclasses.fields(section):
        value = getattr(section, setting.name)
        if dataclasses.is_dataclass(value):
            settings.update(settings_by_key(value, f"{prefix}{setting.name}."))
        else:
            settings[f"{prefix}{setting.name}"] = value
    return settings


def find_yaml(name: str, what: str, folder: str = "") -> Path:
    """The YAML file `name` stands for: the file itself when it ends in .yaml or .yml, else the
    `what` (recipe, suite) of that name installed with selfplay from `configs/` (in its `folder`).
    Raises UserError, listing the installed ones, if there is no such one."""
    if name.endswith((".yaml", ".yml")):
        return Path(name)
    installed = resources.files("selfplay.configs")
    if folder:
        installed = installed / folder
    known = sorted(entry.name.removesuffix(".yaml") for entry in installed.iterdir() if entry.name.endswith(".yaml"))
    if name not in known:
        raise UserError(f"Unknown {what} '{name}': give a YAML file (NAME.yaml), or one of {', '.join(known)}.")
    return Path(str(installed / f"{name}.yaml"))


def read_yaml(path: str | Path, what: str) -> Any:
    """The YAML in the file at `path` (a `what`, for messages); raises UserError if the file cannot
    be read, is larger than a config can be, is not UTF-8 text, or is not valid YAML."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
    except (OSError, ValueError) as err:  # ValueError: a path holding a NUL character
        raise UserError(f"Cannot read {what} '{path}': {getattr(err, 'strerror', None) or err}.") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise UserError(
            f"The {what} '{path}' is larger than {MAX_CONFIG_BYTES >> 20} MiB: it should be a short YAML file."
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(
            f"The {what} '{path}' is not UTF-8 text (at byte {err.start}): it should be a YAML file."
        ) from None
    return parse_yaml(text, f"The {what} '{path}'")


def parse_yaml(text: str, source: str) -> Any:
    """The YAML document in `text`; raises UserError naming `source` and what is wrong where."""
    try:
        loader = _ConfigLoader(text)  # which refuses unprintable characters at once
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as err:
        raise UserError(f"{source} is not valid YAML: {_yaml_problem(err)}.") from None


class _ConfigLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing what a config never needs: a key given twice in one mapping
    (YAML forbids it; the safe loader keeps the last), values nested deeper than MAX_YAML_DEPTH,
    and aliases that expand the document beyond MAX_YAML_NODES values."""

    def __init__(self, text: str):
        super().__init__(text)
        self.depth = 0
        self.expanded = 0  # values composed so far, each alias counting every value it stands for
        self.sizes: dict[int, int] = {}  # a composed node's id -> its values, aliases expanded

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            anchored = self.anchors.get(event.anchor)
            if anchored is not None:  # an unknown alias is the composer's own error
                if id(anchored) not in self.sizes:
                    raise yaml.composer.ComposerError(
                        None, None, f"the alias *{event.anchor} lies inside its own anchor", event.start_mark
                    )
                self._count(self.sizes[id(anchored)], event)
            return super().compose_node(parent, index)
        if self.depth == MAX_YAML_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"values nest more than {MAX_YAML_DEPTH} levels deep", event.start_mark
            )
        before = self.expanded
        self._count(1, event)
        self.depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
        self.sizes[id(node)] = self.expanded - before
        return node

    def _count(self, values: int, event) -> None:
        self.expanded += values
        if self.expanded > MAX_YAML_NODES:
            raise yaml.composer.ComposerError(
                None, None, f"its aliases expand it beyond {MAX_YAML_NODES} values", event.start_mark
            )

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = self.construct_object(key_node)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the key '{key}' is given twice in one mapping", key_node.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep)


def _yaml_problem(err: yaml.YAMLError) -> str:
    """A YAML error's problem and where it lies, in one line."""
    if isinstance(err, yaml.reader.ReaderError):
        return f"character #x{err.character:04x} at position {err.position} is not allowed"
    if isinstance(err, yaml.MarkedYAMLError):
        problem = ": ".join(part for part in (err.context, err.problem) if part)
        mark = err.problem_mark or err.context_mark
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})" if mark else problem
    return " ".join(str(err).split())


def _set_dotted(raw: dict, key: str, value: Any) -> None:
    node = raw
    *parents, leaf = key.split(".")
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise UserError(f"Override '{key}': '{part}' is a value, not a section.")
        node = child
    node[leaf] = value


# Settings that no longer exist, with the value that means what the code now does: the configs
# saved in older run directories carry them, and still load; any other value is refused with why.
RETIRED_SETTINGS = {
    "learner.lora.dropout": (
        0.0,
        "the learner trains with every dropout off, since the sampler samples without it and PPO's ratios compare "
        "two passes of the learner (with dropout they are noise); remove the key",
    ),
}


def build_section(cls, raw: Any, prefix: str = ""):
    """The schema dataclass `cls` from the mapping `raw` (its keys under `prefix`): every value
    converted and checked, defaults where `raw` is silent."""
    where = prefix.rstrip(".") or "the config"
    if not isinstance(raw, dict):
        raise UserError(f"'{where}' must be a section of keys, got {_shown(raw)}.")
    raw = {name: value for name, value in raw.items() if not _retired(f"{prefix}{name}", value)}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields), key=str)
    if unknown:
        raise UserError(f"Unknown config key '{prefix}{unknown[0]}'. Keys of {where}: {', '.join(fields)}.")
    hints = typing.get_type_hints(cls, include_extras=True)
    values = {name: _convert(hints[name], value, f"{prefix}{name}") for name, value in raw.items()}
    return cls(**values)


def _retired(key: str, value: Any) -> bool:
    """Whether `key` is a retired setting at the value the code now keeps (see RETIRED_SETTINGS)."""
    if key not in RETIRED_SETTINGS:
        return False
    kept, why = RETIRED_SETTINGS[key]
    if value != kept:
        raise UserError(f"'{key}' is no longer a setting: {why}.")
    return True


def _convert(hint, value: Any, key: str):
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return build_section(hint, value, prefix=f"{key}.")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(inner, value, key)
    if origin is Literal:
        if value not in args:
            raise UserError(f"Bad value for '{key}': {_shown(value)}; choose one of {', '.join(map(str, args))}.")
        return value
    if origin is Annotated or hint is int:
        return _number(*number_bounds(hint), value, key)
    if origin is list:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list):
            raise UserError(f"Bad value for '{key}': expected a list, got {_shown(value)}.")
        return [_convert(args[0], item, f"{key}[{i}]") for i, item in enumerate(items)]
    if origin is dict:
        weights = args[1] == Weight  # a mapping of names to weights, such as `games`
        if isinstance(value, list) and weights and all(isinstance(name, str) for name in value):
            twice = sorted({name for name in value if value.count(name) > 1})
            if twice:
                raise UserError(f"Bad value for '{key}': '{twice[0]}' is listed twice; give each name once.")
            value = dict.fromkeys(value, 1.0)  # a plain list of names weighs them equally
        if not isinstance(value, dict) or (weights and not value):
            raise UserError(f"Bad value for '{key}': expected a mapping such as {{name: weight}}, got {_shown(value)}.")
        converted = {_convert(args[0], k, key): _convert(args[1], v, f"{key}.{k}") for k, v in value.items()}
        if weights and sum(converted.values()) <= 0:
            raise UserError(f"Bad value for '{key}': the weights must have a positive sum.")
        return converted
    if hint is bool:
        if not isinstance(value, bool):
            raise UserError(f"Bad value for '{key}': expected true or false, got {_shown(value)}.")
        return value
    if hint is str:
        if not isinstance(value, str) or not value:
            raise UserError(f"Bad value for '{key}': expected text, got {_shown(value)}.")
        return value
    raise TypeError(f"config field '{key}' has a type the loader does not handle: {hint}")


def number_bounds(hint) -> tuple[type, Bounds]:
    """The kind (int or float) and the range of a number field of the schema, from its type: a
    plain `int` is a count from 0."""
    return (int, Bounds(0, MAX_COUNT)) if hint is int else typing.get_args(hint)


def _number(kind: type, bounds: Bounds, value: Any, key: str) -> int | float:
    """`value` as a whole number (`kind` int) or a finite number (float) within `bounds`."""
    if kind is int:
        number = value if isinstance(value, int) and not isinstance(value, bool) else None
    else:
        try:
            number = float(value)  # YAML reads 1e-5 (no dot) as a string
        except (TypeError, ValueError, OverflowError):
            number = None
        if isinstance(value, bool) or (number is not None and not math.isfinite(number)):
            number = None
    if number is None or number not in bounds:
        expected = "a whole number" if kind is int else "a number"
        raise UserError(f"Bad value for '{key}': expected {expected} {bounds}, got {_shown(value)}.")
    return number


def _shown(value: Any) -> str:
    """`value` for a message, abridged."""
    return reprlib.repr(value)
