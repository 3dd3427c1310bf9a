"""Training configuration: plain YAML files in `configs/`, dotted `key=value` overrides, and
validation of every key and value before any work starts.

The schema is the dataclasses below; their fields and defaults are the documentation of
what a config may say. A config file only needs the keys it changes.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from selfplay.errors import UserError


@dataclass(frozen=True)
class RolloutConfig:
    games_per_step: int = 64  # games played per training step
    concurrency: int = 256  # games in flight at once
    observation_mode: Literal["single_turn", "multi_turn"] = "single_turn"
    # full: the rules, the state, the legal moves and the answer instruction; view: the state
    # alone, for small models that learn the game from rewards (see selfplay.prompts)
    prompt: Literal["full", "view"] = "full"
    max_turns: int = 50  # a game reaching this many moves is a truncated draw
    max_new_tokens: int = 32  # per turn; a response cut off here is an invalid move
    temperature: float = 1.0
    top_p: float = 1.0
    decoding: Literal["free", "legal"] = "free"  # legal: write only answers naming a legal move (action masking)
    retries: int = 0  # re-asks after an invalid move before it ends the game
    invalid_penalty: float = -1.5  # SPIRAL's training values
    invalid_opponent_reward: float = 0.5

    def probe_settings(self) -> dict:
        """How the exact probes (`move_probabilities`, `exact_report`) ask the model and read its
        answers: as these rollouts ask it and sample them."""
        return {"decoding": self.decoding, "prompt": self.prompt, "temperature": self.temperature}


@dataclass(frozen=True)
class AdvantageConfig:
    estimator: Literal["rae", "turn_level", "grpo", "dr_grpo", "rloo", "trr++", "reinforce"] = "rae"
    decay: float = 0.95  # RAE's baseline decay
    # RAE only: baseline each turn on the batch's other plays of the same prompt, shrunk towards
    # the role's baseline as if it were this many more plays; null keeps one baseline per role.
    state_prior: float | None = None
    turn_discount: float = 1.0  # a turn's advantage times this ** (its player's later turns in the game)
    group_size: int = 1  # plays of each game start per step; grpo, dr_grpo and rloo need more than 1


@dataclass(frozen=True)
class LoraConfig:
    rank: int = 0  # 0 trains every weight; above 0 trains LoRA adapters of this rank (peft)
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


@dataclass(frozen=True)
class LearnerConfig:
    loss: Literal["ppo", "reinforce"] = "ppo"
    lr: float = 1e-5
    # The learning rate over the run: constant, or decaying to 0 across `steps`, linearly or on a
    # cosine, after `warmup_steps` of linear warm-up. A run stopped by max_minutes stops mid-decay.
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    epochs: int = 1  # passes over each step's samples
    minibatches: int = 1  # optimizer steps per epoch
    micro_batch_tokens: int = 16384  # tokens per forward/backward; gradients accumulate across them
    clip: float = 0.2  # PPO ratio clip
    aggregation: Literal["seq_mean_token_mean", "token_mean", "token_sum"] = "token_mean"
    # token_sum divides by this many tokens per sequence (Dr.GRPO); null uses rollout.max_new_tokens.
    token_sum_length: int | None = None
    kl_coef: float = 0.0  # penalty towards the frozen initial policy; 0 loads no reference model
    # Every this many steps the KL reference becomes the current policy: a moving magnet, as in
    # R-NaD and magnetic mirror descent, so that the penalty damps self-play's cycling without
    # holding the policy near its start for good. 0 keeps the initial policy.
    reference_update_every: int = 0
    entropy_coef: float = 0.0  # bonus for the entropy of each response token's distribution
    importance_clip: float | None = 2.0  # truncated importance sampling between sampler and learner
    max_grad_norm: float = 1.0
    precision: Literal["fp32", "bf16"] = "fp32"
    lora: LoraConfig = LoraConfig()


@dataclass(frozen=True)
class EvalConfig:
    every: int = 0  # steps between evaluations of the current policy; 0 never evaluates
    games: list[str] = field(default_factory=list)  # empty: the training games
    opponents: list[str] = field(default_factory=lambda: ["random"])  # fixed opponents, both seats
    episodes: int = 32  # games per game and opponent


@dataclass(frozen=True)
class LeagueConfig:
    """A population beyond the main player: its snapshots, exploiters and scripted agents, with a
    payoff table, ratings and a store in the run directory (see `selfplay/league/`)."""

    enabled: bool = False
    scripted: list[str] = field(default_factory=list)  # agent specs in the population, e.g. [random, "mcts:50"]
    main_exploiters: int = 0  # each trains only against the main player
    league_exploiters: int = 0  # each trains against the whole population
    main_exploiter_opponents: dict[str, float] = field(default_factory=lambda: {"main": 1.0})
    league_exploiter_opponents: dict[str, float] = field(default_factory=lambda: {"pfsp:hard": 1.0})
    # Role -> opponent mix for a seat of that role, in place of the learning player's own mix.
    role_opponents: dict[str, dict[str, float]] = field(default_factory=dict)
    exploiter_lora_rank: int = 8  # exploiters train LoRA adapters of this rank on the initial model
    exploiter_lr: float | None = None  # null: learner.lr (LoRA adapters usually want a larger one)
    snapshot_every: int = 0  # steps between snapshots of a learning player; 0: by win rate and cap only
    snapshot_win_rate: float = 0.7  # snapshot once its win rate against every player it meets exceeds this
    snapshot_min_games: float = 8.0  # decayed games against a player before that win rate counts
    snapshot_max_steps: int = 50  # a snapshot at least this often; 0 for no cap
    population_cap: int = 32  # active snapshots at most; 0 for no cap
    payoff_decay: float = 0.99  # per result between two players (AlphaStar's decayed counts)


@dataclass(frozen=True)
class TrainConfig:
    run_dir: str = "runs/quickstart"
    seed: int = 0
    model: str = "default"  # a Hugging Face model name or directory, or "default"
    backend: Literal["hf", "vllm"] = "hf"
    # The generating backends' weights; bf16 samples faster on CPUs with bfloat16 instructions
    # and on GPUs. The learner keeps fp32 weights whatever this says (see learner.precision).
    backend_precision: Literal["fp32", "bf16"] = "fp32"
    device: str | None = None  # learner device; null picks cuda when present
    steps: int = 100
    max_minutes: float | None = None  # stop (with a checkpoint) after the step that passes this wall time
    games: dict[str, float] = field(default_factory=lambda: {"tictactoe": 1.0})  # game spec -> weight
    # Who the main player meets, by weight: "self" is its current policy; with the league,
    # "uniform" and "pfsp:hard|variance|linear_capped" pick from the population; anything else
    # is a fixed agent spec ("random", "mcts:50", "nash"). See selfplay/league/matchmaking.py.
    opponents: dict[str, float] = field(default_factory=lambda: {"self": 1.0})
    checkpoint_every: int = 50  # steps between checkpoints; the last step is always saved
    keep_checkpoints: int = 2
    rollout: RolloutConfig = RolloutConfig()
    advantages: AdvantageConfig = AdvantageConfig()
    learner: LearnerConfig = LearnerConfig()
    eval: EvalConfig = EvalConfig()
    league: LeagueConfig = LeagueConfig()


def load_config(path: str | Path | None, overrides: list[str] = ()) -> TrainConfig:
    """The config in the YAML file at `path` (defaults where it is silent) with `key=value`
    overrides applied; raises UserError naming the first bad key or value."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as err:
            raise UserError(f"Cannot read config '{path}': {err.strerror}.") from None
        except yaml.YAMLError as err:
            raise UserError(f"Config '{path}' is not valid YAML: {err}") from None
        if not isinstance(raw, dict):
            raise UserError(f"Config '{path}' must be a mapping of keys to values.")
    for override in overrides:
        key, sep, value = override.partition("=")
        if not sep or not key:
            raise UserError(f"Override '{override}' must look like key=value, e.g. learner.lr=1e-5.")
        _set_dotted(raw, key.strip(), yaml.safe_load(value) if value.strip() else None)
    return _build(TrainConfig, raw, prefix="")


def config_to_dict(config) -> dict:
    return dataclasses.asdict(config)


def _set_dotted(raw: dict, key: str, value: Any) -> None:
    node = raw
    *parents, leaf = key.split(".")
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise UserError(f"Override '{key}': '{part}' is a value, not a section.")
        node = child
    node[leaf] = value


def _build(cls, raw: Any, prefix: str):
    where = prefix.rstrip(".") or "the config"
    if not isinstance(raw, dict):
        raise UserError(f"'{where}' must be a section of keys, got {raw!r}.")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise UserError(f"Unknown config key '{prefix}{unknown[0]}'. Keys of {where}: {', '.join(fields)}.")
    hints = typing.get_type_hints(cls)
    values = {name: _convert(hints[name], value, f"{prefix}{name}") for name, value in raw.items()}
    return cls(**values)


def _convert(hint, value: Any, key: str):
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, prefix=f"{key}.")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(inner, value, key)
    if origin is Literal:
        if value not in args:
            raise UserError(f"Bad value for '{key}': {value!r}; choose one of {', '.join(map(str, args))}.")
        return value
    if origin is list:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list):
            raise UserError(f"Bad value for '{key}': expected a list, got {value!r}.")
        return [_convert(args[0], item, f"{key}[{i}]") for i, item in enumerate(items)]
    if origin is dict:
        weights = args[1] is float  # a mapping of names to weights, such as `games`
        if isinstance(value, list) and weights:  # a plain list of names weighs them equally
            value = dict.fromkeys(value, 1.0)
        if not isinstance(value, dict) or (weights and not value):
            raise UserError(f"Bad value for '{key}': expected a mapping such as {{name: weight}}, got {value!r}.")
        converted = {_convert(args[0], k, key): _convert(args[1], v, f"{key}.{k}") for k, v in value.items()}
        if weights and (any(v < 0 for v in converted.values()) or sum(converted.values()) <= 0):
            raise UserError(f"Bad value for '{key}': weights must be non-negative with a positive sum.")
        return converted
    if hint is bool:
        if not isinstance(value, bool):
            raise UserError(f"Bad value for '{key}': expected true or false, got {value!r}.")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UserError(f"Bad value for '{key}': expected a whole number >= 0, got {value!r}.")
        return value
    if hint is float:
        try:
            number = float(value)  # YAML reads 1e-5 (no dot) as a string
        except (TypeError, ValueError):
            raise UserError(f"Bad value for '{key}': expected a number, got {value!r}.") from None
        if isinstance(value, bool) or number != number:
            raise UserError(f"Bad value for '{key}': expected a number, got {value!r}.")
        return number
    if hint is str:
        if not isinstance(value, str) or not value:
            raise UserError(f"Bad value for '{key}': expected text, got {value!r}.")
        return value
    raise TypeError(f"config field '{key}' has a type the loader does not handle: {hint}")
