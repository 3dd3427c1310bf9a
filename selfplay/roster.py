"""Who plays in a training run, and how each generates.

A run seats its learning players (the main player and the league's exploiters: each a learner
and the backend serving its weights), the league's frozen snapshots (each served by a
transformers backend, loaded when first matched) and scripted agents (seated by their specs).
Every LoRA learner (the main player's and the exploiters') trains an adapter of its own, with
its own optimizer, over one frozen copy of the initial model, and with the `hf` backend
generates with its own learner's model; with `learner.adapter_per_role` the main player is one
such adapter per role of the run's games, each role's turns played and learned by its own. A
LoRA learner's snapshot is its adapter alone, served over the main LoRA learner's own model
(`AdapterPool`: one base for every past player, a bounded number of adapters in memory); a
full learner's snapshot is its whole weights, served by a copy of the model of its own. With
`backend: vllm` and a LoRA main player, one vLLM engine serves the base model and every
adapter: the LoRA learning players' (each sync loads the new adapter) and the adapter
snapshots', each request carrying its player's (exact probes still read snapshots through
transformers, over the main learner's model). The
`Roster` owns the first two, answers which backend or agent spec plays each label of a step's
matches, and reads snapshots' exact move probabilities for the league's exact payoffs. The
trainer (`selfplay.train`) keeps the loop and asks it.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from selfplay.backends import PRECISIONS, PolicyBackend, make_backend
from selfplay.backends.base import checked_weights
from selfplay.backends.hf_backend import AdapterPool, HFBackend, PooledAdapter, merged_adapter_weights
from selfplay.checkpoint import role_adapter_part
from selfplay.config import TrainConfig
from selfplay.distributed.learner_group import LearnerGroup
from selfplay.errors import UserError
from selfplay.evaluation.exploitability import move_probabilities
from selfplay.evaluation.meta_strategy import mixture_probabilities
from selfplay.games import make_game
from selfplay.league.exploiter_stopping import ExactCheck, best_response_value, value_against
from selfplay.league.matchmaking import MAIN
from selfplay.learner import Learner, RoleLearners
from selfplay.rollouts import MatchSpec, RolePolicies, RolloutSettings
from selfplay.run_dir import RunDir, is_adapter
from selfplay.scoring import pick_device

if TYPE_CHECKING:
    from selfplay.backends.vllm_backend import VLLMBackend
    from selfplay.distributed.worker_pool import RolloutWorkers
    from selfplay.league.manager import League


def _trains_one_adapter(learner) -> bool:
    """Whether `learner` is a one-process LoRA learner, whose policy is its adapter over the initial model."""
    return isinstance(learner, Learner) and learner.lora


def vllm_shares_learner_gpu(config: TrainConfig) -> bool:
    """Whether the main player's vLLM engine (on the trainer's GPU, cuda:0) shares that GPU with
    its learner: a one-process learner there, or a sharded one on every GPU of the machine."""
    if config.backend != "vllm" or not torch.cuda.is_available():
        return False
    learner = config.learner
    if learner.processes > 1:
        return learner.processes == torch.cuda.device_count()
    device = torch.device(pick_device(config.device))
    return device.type == "cuda" and device.index in (None, 0)


def training_roles(config: TrainConfig) -> list[str]:
    """The roles of the run's games, each trained as an adapter of its own under
    `learner.adapter_per_role`; UserError where the run cannot train one per role."""
    setting = "learner.adapter_per_role"
    refusals = [
        (
            config.league.enabled,
            "trains the main player alone, and the league's snapshots and exploiters are one policy each: set "
            "league.enabled=false",
        ),
        (
            config.backend != "hf",
            "generates with each role's learner's own model, through transformers: set backend=hf",
        ),
        (
            config.distributed.rollout_workers > 0,
            "generates in the trainer's process, which holds each role's adapter: set distributed.rollout_workers=0",
        ),
    ]
    for refused, why in refusals:
        if refused:
            raise UserError(f"{setting} {why}, or {setting}=false.")
    roles: dict[str, None] = {}
    for key, specs in (("games", config.games), ("eval.games", config.eval.games)):
        for spec in specs:
            game_roles = make_game(spec).roles
            if not game_roles:
                raise UserError(
                    f"{setting} trains an adapter for each role, but '{spec}' (in {key}) has no roles (its seats play "
                    f"alike): play role games only (secret_keeping, proposer_solver), or set {setting}=false."
                )
            roles.update(dict.fromkeys(game_roles))
    if len(roles) < 2:
        raise UserError(
            f"{setting} trains an adapter for each role, but the run's games have one role only "
            f"({', '.join(roles)}): set {setting}=false, which trains it as one policy."
        )
    return list(roles)


@dataclass
class LearningPlayer:
    """A policy in training: its learner, the backend generating with its weights, its
    advantage baselines, and for an exploiter under `league.exploiter_keep_best` its best exact
    check since its restart (whose weights its learner keeps)."""

    name: str
    learner: Learner
    backend: PolicyBackend
    baselines: dict = field(default_factory=dict)
    best_check: ExactCheck | None = None


class Roster:
    """The policies a run seats and how each is served. `players` are the learning players by
    name; `frozen` the snapshots' backends loaded so far. `league` is the run's league, whose
    snapshots it serves: the trainer sets it once the league is open (the league itself asks the
    roster for snapshots' exact returns). `workers`: the rollout workers of a distributed run,
    which then generate, every learner's weights published to them at each sync."""

    def __init__(
        self,
        config: TrainConfig,
        model_path: Path,
        run_dir: Path,
        rollout_settings: RolloutSettings,
        workers: RolloutWorkers | None = None,
    ):
        self.config = config
        self.model_path = model_path
        self.run_dir = run_dir
        self.rollout_settings = rollout_settings
        self.workers = workers
        self.league: League | None = None
        self.players: dict[str, LearningPlayer] = {}
        self.frozen: dict[str, PolicyBackend] = {}  # snapshots' backends, loaded when first matched
        self.snapshot_policies: dict[str, dict] = {}  # snapshots' move probabilities, once exact payoffs ask
        self.shared_base = None  # the initial model under every LoRA learner's adapter, once needed
        self.adapters: AdapterPool | None = None  # adapter snapshots over the main learner's model, once served
        self.adapter_engine: VLLMBackend | None = None  # the vLLM engine serving every adapter, if one does

    # -- learning players ----------------------------------------------------------------------

    def add_learning_player(self, name: str, checkpoint: Path | None = None, version: int = 0) -> LearningPlayer:
        """Seat the learning player `name` (the main player, or an exploiter): a learner from
        `checkpoint` (or the initial model) and a backend serving its weights, synced as `version`.
        Every LoRA learner (the main player's, the exploiters') trains its own adapter, with its
        own optimizer, over one frozen copy of the initial model (`_shared_base`), and with the
        `hf` backend generates with its learner's own model: a LoRA player costs its adapter and
        optimizer state, not another copy of the weights."""
        config = self.config
        exploiter = name != MAIN
        if not exploiter and config.learner.adapter_per_role:
            return self._add_role_player(checkpoint, version)
        learner_config = self._exploiter_config() if exploiter else config.learner
        shared_base = self._shared_base() if learner_config.lora.rank > 0 else None
        settings = self._learner_settings(checkpoint)
        if learner_config.processes > 1:
            learner = LearnerGroup(self.model_path, learner_config, **settings)
        else:
            learner = Learner(self.model_path, learner_config, shared_base=shared_base, **settings)
        try:
            player = LearningPlayer(name, learner, self._backend_for(name, learner, shared_base))
        except BaseException:
            if isinstance(learner, LearnerGroup):  # its processes must not outlive a failed start
                learner.close()
            raise
        self.players[name] = player
        if checkpoint is not None:
            self.sync(player, version)
        return player

    def _add_role_player(self, checkpoint: Path | None, version: int) -> LearningPlayer:
        """The main player as one LoRA adapter per role of the run's games, over the shared base
        (`learner.adapter_per_role`): a learner each, from its part of `checkpoint`, each
        generating with its own model; the rollout seats each role's turns with its own."""
        learners = {
            role: Learner(
                self.model_path,
                self.config.learner,
                shared_base=self._shared_base(),
                **self._learner_settings(role_adapter_part(checkpoint, role) if checkpoint is not None else None),
            )
            for role in training_roles(self.config)
        }
        policies = {
            role: make_backend("hf", str(self.model_path), device=learner.device, model=learner.model)
            for role, learner in learners.items()
        }
        player = LearningPlayer(MAIN, RoleLearners(learners), RolePolicies(policies))
        player.backend.version = version
        self.players[MAIN] = player
        return player

    def _learner_settings(self, checkpoint: Path | None) -> dict:
        """A learner's settings from the run's config, resumed from `checkpoint` if given."""
        config = self.config
        return {
            "temperature": config.rollout.temperature,
            "token_sum_length": config.rollout.max_new_tokens,
            "device": config.device,
            "seed": config.seed,
            "resume_from": checkpoint,
        }

    def restart_exploiter(self, name: str, version: int) -> None:
        """Start the exploiter `name` again after its snapshot: from the initial weights, or with
        `league.exploiter_init: main` from the main player's current ones, its KL reference moved
        to them with `league.exploiter_reference: start`; synced as `version`."""
        self.players[name].backend.close()
        player = self.add_learning_player(name)
        if self.config.league.exploiter_init == "main":
            main_weights = self.players[MAIN].learner.policy_weights()  # a stream, read under no_grad
            with torch.no_grad():
                for _, tensor, target in checked_weights(player.learner.model, main_weights):
                    target.copy_(tensor)
            if self.config.league.exploiter_reference == "start":
                player.learner.move_reference()
        self.sync(player, version)

    def sync(self, player: LearningPlayer, version: int) -> None:
        """The learner's current weights to its backend (and the rollout workers), as `version`,
        streamed: no file, and no whole model gathered by a sharded learner. A LoRA learner served
        by the adapter engine sends its adapter alone, saved for the engine to load."""
        if self.workers is not None:
            self.workers.publish(player.name, self.backend_weights(player.name), version)
        if player.backend.shares_model:
            player.backend.version = version
        elif self._serves_adapter_of(player.learner):
            with player.backend.adapter_update(version) as directory:
                player.learner.export_adapter(directory)
        else:
            player.backend.load_state(self.backend_weights(player.name), version=version)

    def backend_weights(self, name: str) -> Iterator[tuple[str, torch.Tensor]]:
        """A learning player's weights as its backends take them: streamed, in the backends' precision."""
        return self.players[name].learner.policy_weights(PRECISIONS[self.config.backend_precision])

    def _backend_for(self, name: str, learner, shared_base) -> PolicyBackend:
        """The backend generating with `learner`'s weights. The rollout workers generate for a
        distributed run: the trainer's backend then only evaluates. A LoRA learner generates with
        its own model with the `hf` backend, but for a main player asked to generate at bf16
        (`backend_precision`), which gets a copy at that precision."""
        config = self.config
        sharded = isinstance(learner, LearnerGroup)
        at_own_precision = name != MAIN or config.backend_precision == "fp32"
        own_model = shared_base is not None and config.backend == "hf" and at_own_precision
        if own_model or (self.workers is not None and not sharded):
            return make_backend("hf", str(self.model_path), device=learner.device, model=learner.model)
        if self.workers is not None:  # a sharded learner has no whole model to share: a copy it streams into
            return make_backend("hf", str(self.model_path), config.backend_precision, device=learner.device)
        if self._serves_adapter_of(learner):
            return self.adapter_engine.sharing_engine()
        colocated = {"sleep_while_learning": True} if name == MAIN and vllm_shares_learner_gpu(config) else {}
        if name == MAIN and config.backend == "vllm" and _trains_one_adapter(learner):
            self.adapter_engine = make_backend(
                "vllm", str(self.model_path), config.backend_precision, **colocated, **self._adapter_engine_options()
            )
            return self.adapter_engine
        return make_backend(config.backend, str(self.model_path), config.backend_precision, **colocated)

    def _serves_adapter_of(self, learner) -> bool:
        """Whether the adapter engine serves `learner`'s policy as an adapter."""
        return self.adapter_engine is not None and _trains_one_adapter(learner)

    def _adapter_engine_options(self) -> dict:
        """The adapter engine's LoRA settings: ranks up to the LoRA learners', and room for every
        learning player's adapter beside league.resident_adapters snapshots'."""
        from selfplay.backends.vllm_backend import adapter_engine_options

        learner, league = self.config.learner, self.config.league
        exploiters = league.main_exploiters + league.league_exploiters if league.enabled else 0
        if not league.exploiter_lora_rank:  # whole-model exploiters have engines of their own
            exploiters = 0
        ranks = [learner.lora.rank, *([league.exploiter_lora_rank] if exploiters else [])]
        return adapter_engine_options(ranks, 1 + exploiters + (league.resident_adapters if league.enabled else 0))

    def _shared_base(self):
        """The initial model in float32, loaded once: the frozen base under every LoRA learner's
        adapter (each learner wraps a module tree of its own around these very tensors)."""
        if self.shared_base is None:
            from transformers import AutoModelForCausalLM

            device = pick_device(self.config.device)
            self.shared_base = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32).to(device)
        return self.shared_base

    def _exploiter_config(self):
        learner, league = self.config.learner, self.config.league
        # An exploiter's KL reference is the shared base under its adapters, which stays put. Each
        # restart is a new learner whose lifetime the snapshot rule decides as it goes, so its
        # rate and KL penalty do not decay with the run's: it warms up from each restart, then stays.
        # Exploiters train in the trainer's process: the main player's learner alone is sharded.
        return dataclasses.replace(
            learner,
            processes=1,
            offload=False,
            lr=learner.lr if league.exploiter_lr is None else league.exploiter_lr,
            lr_schedule="constant",
            kl_coef=self.config.exploiter_kl_coef,
            lora=dataclasses.replace(learner.lora, rank=league.exploiter_lora_rank),
            reference_update_every=0,
            reference_update_rate=1.0,
            kl_schedule="constant",
        )

    # -- snapshots -----------------------------------------------------------------------------

    def freeze(self, learner: str, snapshot: str, whole: bool = False) -> str:
        """Write a learning player's current policy as the snapshot `snapshot`; returns its path
        relative to the run directory. An exploiter that kept its best checked weights
        (`league.exploiter_keep_best`) is frozen with them, put back into its learner. A
        one-process LoRA learner's is its adapter alone (over the run's initial model), unless
        rollout workers play the games (they load whole weights) or `whole` asks for the whole
        weights (benchmarks/league_adapters.py compares the two)."""
        player = self.players[learner].learner
        if learner != MAIN and player.kept is not None:
            player.restore_kept_weights()
        files = RunDir(self.run_dir)
        if self.workers is None and isinstance(player, Learner) and player.lora and not whole:
            path = files.adapter_snapshot(snapshot)
            # Left by a run that stopped before recording this step, which its resume replays: no
            # league record names it.
            shutil.rmtree(path, ignore_errors=True)
            player.export_adapter(path)
        else:
            path = files.snapshot(snapshot)
            path.parent.mkdir(parents=True, exist_ok=True)
            player.export_weights(path)
        return str(path.relative_to(self.run_dir))

    def snapshot_weights(self, name: str) -> Path:
        """The weights of the league's snapshot `name`: a safetensors file, or an adapter directory."""
        weights = self.run_dir / self.league.players[name].weights
        if not weights.exists():
            raise UserError(
                f"The weights of league player '{name}' are missing ({weights}). The run directory is "
                "incomplete: restore the file, or start a new run."
            )
        if self.workers is not None and is_adapter(weights):
            raise UserError(
                f"League player '{name}' is a LoRA adapter ({weights}), written by this run without rollout "
                "workers, and rollout workers load whole snapshots only: resume it without "
                "distributed.rollout_workers, or start a new run with them."
            )
        return weights

    def frozen_backend(self, name: str) -> PolicyBackend:
        """The backend of a snapshot, loaded on first use. An adapter snapshot generates in the
        adapter engine where there is one; otherwise snapshots generate with transformers
        whatever the training backend (a vLLM engine per snapshot would each reserve its own
        share of the GPU)."""
        if name not in self.frozen:
            weights = self.snapshot_weights(name)
            if self.adapter_engine is not None and is_adapter(weights):
                backend = self.adapter_engine.sharing_engine()
                backend.load_adapter(weights, self.league.players[name].created_step)
            else:
                backend = self._transformers_snapshot(name)
            self.frozen[name] = backend
        return self.frozen[name]

    def _transformers_snapshot(self, name: str) -> HFBackend:
        """A snapshot served by transformers. An adapter snapshot generates through the main LoRA
        learner's model (`AdapterPool`); without one to lend, through a copy of the model with
        the adapter merged."""
        weights = self.snapshot_weights(name)
        version = self.league.players[name].created_step
        pool = self._adapter_pool() if is_adapter(weights) else None
        # Every snapshot is the run's model: one tokenizer for all (the main learner's).
        tokenizer = self.players[MAIN].learner.tokenizer
        if pool is not None:
            backend = make_backend(
                "hf",
                str(self.model_path),
                device=self.players[MAIN].learner.device,
                model=pool.model,
                frozen=True,
                adapter=PooledAdapter(pool, name, weights),
                tokenizer=tokenizer,
            )
            backend.version = version
            return backend
        backend = make_backend(
            "hf",
            str(self.model_path),
            self.config.backend_precision,
            device=self.config.device,
            frozen=True,
            tokenizer=tokenizer,
        )
        if is_adapter(weights):
            backend.load_state(merged_adapter_weights(self.model_path, weights), version)
        else:
            backend.load_weights(weights, version=version)
        return backend

    def _adapter_pool(self) -> AdapterPool | None:
        """The pool of adapter snapshots over the main learner's model; None where the main
        player is no one-process LoRA learner, whose frozen base is the snapshots' initial model."""
        main = self.players[MAIN].learner
        if not (isinstance(main, Learner) and main.lora):
            return None
        if self.adapters is None:
            self.adapters = AdapterPool(main.model, self.config.league.resident_adapters)
        return self.adapters

    def retire(self, names: Sequence[str]) -> None:
        """Unload retired snapshots from whatever generates with them."""
        if self.workers is not None:
            self.workers.retire(names)
        for name in names:
            backend = self.frozen.pop(name, None)
            if backend is not None:
                backend.close()
            if self.adapters is not None:
                self.adapters.unload(name)

    def snapshot_policy(self, name: str, game: str) -> dict:
        """A snapshot's move probabilities in `game`, read as its backend plays (snapshots never
        change); through transformers, over the main learner's model, for one the adapter engine serves."""
        if name not in self.snapshot_policies:
            backend = self.frozen_backend(name)
            if not isinstance(backend, HFBackend):
                backend = self._transformers_snapshot(name)
            with backend.serving() as model:
                policy = move_probabilities(model, backend.tokenizer, game, self.rollout_settings)
            self.snapshot_policies[name] = policy
        return self.snapshot_policies[name]

    def exact_return(self, game: str, player: str, opponent: str) -> float:
        """A past player's exact expected return against another in `game`, averaged over the seats."""
        return value_against(game, self.snapshot_policy(player, game), self.snapshot_policy(opponent, game))

    def learning_policy(self, name: str, game: str) -> dict:
        """A learning player's move probabilities in `game` as its weights stand now."""
        learner = self.players[name].learner
        with learner.scoring_model() as model:
            return move_probabilities(model, learner.tokenizer, game, self.rollout_settings)

    def mixture_policy(self, game: str, weights: Mapping[str, float]) -> dict:
        """The move probabilities of past players mixed by `weights` (name -> probability)."""
        policies = [self.snapshot_policy(name, game) for name in weights]
        return mixture_probabilities(game, policies, list(weights.values()))

    def target_value(self, game: str, weights: Mapping[str, float]) -> float:
        """A best response's exact expected return against past players mixed by `weights`."""
        return best_response_value(game, self.mixture_policy(game, weights))

    def value_against(self, name: str, game: str, weights: Mapping[str, float]) -> float:
        """Learning player `name`'s exact expected return against past players mixed by `weights`."""
        return value_against(game, self.learning_policy(name, game), self.mixture_policy(game, weights))

    # -- seating -------------------------------------------------------------------------------

    def seat(self, matches: Sequence[MatchSpec]) -> dict:
        """Engine players for every label seated in `matches`: learning players' and snapshots'
        backends, and scripted agents by their specs."""
        snapshots = {p.name for p in self.league.snapshots()}
        seated = {}
        for label in {label for match in matches for label in match.players}:
            if label in self.players:
                seated[label] = self.players[label].backend
            elif label in snapshots:
                seated[label] = self.frozen_backend(label)
            else:
                seated[label] = label
        return seated

    def closers(self) -> list[tuple[str, object]]:
        """What releases what the roster holds, each step described: every backend, then every
        sharded learner's processes."""
        backends = [*((name, p.backend) for name, p in self.players.items()), *self.frozen.items()]
        groups = [(name, p.learner) for name, p in self.players.items() if isinstance(p.learner, LearnerGroup)]
        return [
            *((f"closing {name}'s backend", backend.close) for name, backend in backends),
            *((f"stopping {name}'s learner processes", learner.close) for name, learner in groups),
        ]
