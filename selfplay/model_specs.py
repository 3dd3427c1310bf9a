"""What a model spec names: one rule for the `model:` agents of `selfplay play`, `selfplay eval
--checkpoints` and `--opponents`, a config's `model`, and `selfplay export`.

A model spec is any of:

- what `selfplay.default_model.resolve_model` loads: a Hugging Face model directory or hub
  name, `default`, a GGUF file;
- a checkpoint directory, `RUN_DIR/checkpoints/step-NNNNNN` (a Hugging Face model directory
  beside the training state), or a league exploiter's part of one;
- a run directory: its newest whole checkpoint;
- a league player, `RUN_DIR@PLAYER`, named as `selfplay league show` names it: a snapshot
  (`runs/league@main@000004`: its bare weights file, `RunDir.snapshot`, loaded over the run's
  model configuration and tokenizer, or a LoRA learner's adapter, `RunDir.adapter_snapshot`,
  merged into the run's initial model; the file's or directory's own path names it too), or a learning player
  (`runs/league@main`, `runs/league@main_exploiter_0`): its part of the run's newest checkpoint;
- a role's adapter of a run that trained one per role (`learner.adapter_per_role`), `RUN_DIR@ROLE`
  (`runs/red_team@attacker`: the newest checkpoint's) or `RUN_DIR/checkpoints/step-NNNNNN@ROLE`,
  merged into the run's initial model.

A model from a run keeps how its run asked and sampled it (its config's `rollout` section):
`play` and `eval` play it so unless an option says otherwise (`ModelSpec.played_with`), and
`export` records it in the model directory it writes, where `model_spec` reads it back (as it
reads the built-in `default` model's record: legal decoding on the state alone).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from safetensors import safe_open

from selfplay.backends import PolicyBackend, make_backend
from selfplay.checkpoint import (
    ADAPTER_DIR,
    READ_ERRORS,
    STATE_FILE,
    checkpoint_problem,
    checkpoint_step,
    exploiter_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    role_adapter_part,
    role_adapters,
)
from selfplay.config import RolloutConfig, build_section, load_config
from selfplay.default_model import (
    BUILD_INFO,
    MODEL_SPECS_HELP,
    built_in_place,
    converted_once,
    file_checksums,
    resolve_model,
)
from selfplay.errors import UserError
from selfplay.files import WriteError, file_sha256, published_directory, set_file_permissions_from_directory
from selfplay.rollouts import RolloutSettings
from selfplay.run_dir import RunDir, is_adapter

# How a model is asked and sampled: the settings of its run's `rollout` section that a model
# keeps. The rest (a game's turn cap, its invalid-move rules) bind every player of a game alike.
STYLE_SETTINGS = ("decoding", "prompt", "observation_mode", "temperature", "top_p", "max_new_tokens")
SAMPLING_STYLE = ("decoding", "temperature", "top_p", "max_new_tokens")  # those of `RolloutSettings.sampling`
PROMPT_STYLE = ("prompt", "observation_mode")
PLAYER_SEPARATOR = "@"  # RUN_DIR@PLAYER
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # an adapter directory's tensors, as peft saves them


@dataclass(frozen=True)
class ModelSpec:
    """A model that a spec names, ready to load."""

    name: str  # how reports and messages name it
    model: str  # a loadable model directory or hub name: configuration, tokenizer, and weights unless `weights`
    step: int | None = None  # the training step of a checkpoint or snapshot
    # A league snapshot's weights file, loaded over `model`'s; or a LoRA snapshot's adapter
    # directory, merged into `model` (then the run's initial model).
    weights: str | None = None
    trained_with: RolloutConfig | None = None  # its run's `rollout` section, or its directory's record of one

    def played_with(self, rollout: RolloutSettings, fixed: Collection[str] = ()) -> RolloutSettings:
        """How to ask and sample this model: as its run did (`STYLE_SETTINGS`), but for the
        settings named in `fixed` (a command's options), which `rollout` gives; a model from no
        run wholly as `rollout` says. The games' rules are `rollout`'s either way."""
        if self.trained_with is None:
            return rollout
        trained = RolloutSettings.from_config(self.trained_with)
        sampling = {name: getattr((rollout if name in fixed else trained).sampling, name) for name in SAMPLING_STYLE}
        prompting = {name: getattr(rollout if name in fixed else trained, name) for name in PROMPT_STYLE}
        return replace(rollout, sampling=replace(rollout.sampling, **sampling), **prompting)

    def policy(self, backend: str = "hf") -> PolicyBackend:
        """A backend of kind `backend` serving the model."""
        try:
            policy = make_backend(backend, self.model)
        except OSError as err:
            raise UserError(
                f"Cannot load the model '{self.name}': {' '.join(str(err).split())}. Give {MODEL_SPECS_HELP}."
            ) from None
        if self.weights is None:
            return policy
        if is_adapter(self.weights):
            from selfplay.backends.hf_backend import merged_adapter_weights

            policy.load_state(merged_adapter_weights(self.model, Path(self.weights)), version=self.step or 0)
        else:
            policy.load_weights(Path(self.weights), version=self.step or 0)
        return policy

    def network(self, own_precision: bool = False):
        """The model as a transformers model, in float32 (for probes) or in `own_precision`, and its
        tokenizer."""
        import torch
        from safetensors.torch import load_model
        from transformers import AutoModelForCausalLM, AutoTokenizer

        dtype = "auto" if own_precision else torch.float32
        model = AutoModelForCausalLM.from_pretrained(self.model, dtype=dtype).eval()
        if self.weights is not None and is_adapter(self.weights):
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, self.weights).merge_and_unload()
        elif self.weights is not None:
            load_model(model, self.weights)
        return model, AutoTokenizer.from_pretrained(self.model)

    def weights_file(self) -> Path | None:
        """The file holding the weights `weights` names: the file itself, or an adapter's tensors."""
        if self.weights is None:
            return None
        return Path(self.weights) / ADAPTER_WEIGHTS if is_adapter(self.weights) else Path(self.weights)


def style_of(settings: RolloutSettings) -> dict:
    """The `STYLE_SETTINGS` of `settings`, by name: how a model is asked and sampled."""
    return {name: getattr(settings.sampling if name in SAMPLING_STYLE else settings, name) for name in STYLE_SETTINGS}


def model_spec(spec: str) -> ModelSpec:
    """The model `spec` names (see the module's docstring). A spec that names none, a damaged
    checkpoint or snapshot, or a player the league does not have raises UserError with the fix."""
    path = Path(spec)
    player = _league_player(spec)
    if player is not None:
        return player
    if path.suffix == ".safetensors" or is_adapter(path):
        return _snapshot_file(path)
    if (path / STATE_FILE).is_file():
        return checkpoint_model(path)
    run = RunDir.of_checkpoint(path)
    if run is not None and run.config.is_file() and not path.exists():
        saved = ", ".join(checkpoint.name for checkpoint in list_checkpoints(run.path)) or "none yet"
        raise UserError(
            f"No checkpoint '{path}': the run '{run.path}' holds {saved}. Give one of them, or the run directory "
            "for its newest."
        )
    if RunDir(path).config.is_file() and not (path / "config.json").is_file():
        return checkpoint_model(_newest_checkpoint(RunDir(path)))
    model = resolve_model(spec)
    return ModelSpec(spec, model, trained_with=_recorded_rollout(Path(model)))


def checkpoint_model(path: Path) -> ModelSpec:
    """The model of the checkpoint (or an exploiter's part of one) at `path`, with its run's
    rollout settings when it lies in a run directory."""
    roles = role_adapters(path)
    if roles:
        raise UserError(
            f"Checkpoint '{path}' holds an adapter for each role ({', '.join(roles)}), not one model: name one, as "
            f"{path}@{roles[0]}, or RUN_DIR@{roles[0]} for the newest checkpoint's."
        )
    _refuse_damaged(path)
    run = RunDir.of_checkpoint(path)
    if run is None or not run.config.is_file():  # a checkpoint copied out of its run: a model directory
        return ModelSpec(str(path), str(path), checkpoint_step(path))
    name = f"{run.path.name}/{Path(path).relative_to(run.checkpoints).as_posix()}"
    return ModelSpec(name, str(path), checkpoint_step(path), trained_with=load_config(run.config).rollout)


def role_adapter(checkpoint: Path, role: str) -> ModelSpec:
    """The adapter of `role` in `checkpoint`, of a run that trained one per role, over the run's
    initial model."""
    checkpoint = Path(checkpoint)
    roles = role_adapters(checkpoint)
    if role not in roles:
        held = f"adapters of the roles {', '.join(roles)}" if roles else "one policy for every role"
        raise UserError(f"Checkpoint '{checkpoint}' holds no adapter of the role '{role}': it holds {held}.")
    _refuse_damaged(checkpoint)
    run = RunDir.of_checkpoint(checkpoint)
    if run is None or not run.config.is_file():
        raise UserError(
            f"The adapter of '{role}' in '{checkpoint}' applies to its run's initial model, which the run's "
            f"{RunDir('RUN_DIR').config.name} names: give the checkpoint inside its run directory."
        )
    config = load_config(run.config)
    adapter = role_adapter_part(checkpoint, role) / ADAPTER_DIR
    name = f"{run.path.name}/{checkpoint.name}{PLAYER_SEPARATOR}{role}"
    return ModelSpec(
        name, model_directory(config.model), checkpoint_step(checkpoint), str(adapter), trained_with=config.rollout
    )


def _refuse_damaged(checkpoint: Path) -> None:
    problem = checkpoint_problem(checkpoint)
    if problem:
        raise UserError(
            f"Checkpoint '{checkpoint}' is damaged ({problem}): give another checkpoint, or its run directory for "
            "the newest whole one."
        )


def _newest_checkpoint(run: RunDir) -> Path:
    if not list_checkpoints(run.path):
        raise UserError(
            f"The run '{run.path}' has no checkpoint yet, so it names no model: give it once it has saved one, or "
            "give the model it started from (its config's `model`)."
        )
    return latest_checkpoint(run.path)


def _league_player(spec: str) -> ModelSpec | None:
    """The league player or role adapter `spec` names as RUN_DIR@PLAYER (or CHECKPOINT@ROLE);
    None if it names none that way. A player's name holds the separator too (`main@000004`), so
    the run is the shortest prefix that is a run directory."""
    for at, character in enumerate(spec):
        if character != PLAYER_SEPARATOR:
            continue
        before, name = Path(spec[:at]), spec[at + 1 :]
        if (before / STATE_FILE).is_file():
            return role_adapter(before, name)
        if RunDir(before).config.is_file():
            return league_player(RunDir(before), name)
    return None


def league_player(run: RunDir, name: str) -> ModelSpec:
    """The model of the player `name` of `run`'s league: a snapshot's weights, or a learning
    player's part of the run's newest checkpoint. In a run that trained an adapter per role,
    the role `name`'s adapter in its newest checkpoint."""
    from selfplay.league.store import LeagueStore

    if load_config(run.config).learner.adapter_per_role:
        return role_adapter(_newest_checkpoint(run), name)
    if not run.league_store.is_file():
        raise UserError(
            f"'{run.path}' holds no league ({run.league_store.name} is missing), so it has no player '{name}'. Name "
            "a player of a run trained with league.enabled=true, or give the run directory alone for its newest "
            "checkpoint."
        )
    with LeagueStore(run.league_store, read_only=True) as store:
        players = {player.name: player for player in store.players()}
    player = players.get(name)
    if player is None:
        models = [p.name for p in players.values() if p.kind != "scripted"]
        raise UserError(
            f"No player '{name}' in the league of '{run.path}'. Its models: {', '.join(models)} "
            f"(`selfplay league show {run.path}` shows them all)."
        )
    if player.kind == "scripted":
        raise UserError(
            f"'{name}' is a scripted agent of the league of '{run.path}', not a model: give it as the agent "
            f"spec '{name}'."
        )
    if player.kind == "snapshot":
        return _snapshot(run, name, run.path / player.weights, player.created_step)
    checkpoint = _newest_checkpoint(run)
    return checkpoint_model(checkpoint if player.kind == "main" else exploiter_checkpoint(checkpoint, name))


def _snapshot_file(path: Path) -> ModelSpec:
    run = RunDir.of_snapshot(path)
    name = path.name if is_adapter(path) else path.stem
    _, _, step = name.rpartition(PLAYER_SEPARATOR)
    if run is None or not path.exists() or not run.config.is_file() or not step.isdigit():
        layout = RunDir("RUN_DIR")
        raise UserError(
            f"'{path}' is not a league snapshot: expected an existing {layout.snapshot('PLAYER@STEP')} (or adapter "
            f"directory {layout.adapter_snapshot('PLAYER@STEP')}) inside a run directory with its "
            f"{layout.config.name}, or name the player as RUN_DIR@PLAYER."
        )
    return _snapshot(run, name, path, int(step))


def _snapshot(run: RunDir, name: str, weights: Path, step: int) -> ModelSpec:
    adapter = is_adapter(weights)
    try:
        # Checks the file holds every tensor its header lists.
        with safe_open(str(weights / ADAPTER_WEIGHTS if adapter else weights), framework="pt"):
            pass
    except READ_ERRORS as err:
        raise UserError(
            f"The weights of league player '{name}' ({weights}) are missing or damaged ({err}). Restore the file "
            "from a copy, or give another player."
        ) from None
    config = load_config(run.config)
    # The run's checkpoints carry the model's configuration and tokenizer as the run used them; an
    # adapter applies to the run's initial model, which a LoRA run's checkpoints hold merged with its own.
    if list_checkpoints(run.path) and not adapter:
        model = str(latest_checkpoint(run.path))
    else:
        model = model_directory(config.model)
    return ModelSpec(name, model, step, str(weights), trained_with=config.rollout)


def _recorded_rollout(model_dir: Path) -> RolloutConfig | None:
    """The rollout settings `export` recorded in a model directory; None where it recorded none."""
    try:
        record = json.loads((model_dir / BUILD_INFO).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or "rollout" not in record:
        return None
    try:
        return build_section(RolloutConfig, record["rollout"], prefix="rollout.")
    except UserError as err:
        raise UserError(
            f"'{model_dir / BUILD_INFO}' records how its model was trained in a form this selfplay cannot read "
            f"({err}). Export the model again, or delete its `rollout` entry."
        ) from None


def model_directory(spec: str) -> str:
    """A model directory or hub name for `spec`, as training loads its initial model: a league
    snapshot, whose weights lie apart from its configuration, is exported once into
    SELFPLAY_HOME/models/snapshots/SHA256."""
    model = model_spec(spec)
    if model.weights is None:
        return model.model
    return str(converted_once(model.weights_file(), "snapshots", lambda path: _write_model(model, path)))


def export(model: ModelSpec, out_dir: str | Path) -> Path:
    """Write `model` as a standalone Hugging Face model directory into `out_dir`, which must be
    new or empty: its configuration, generation config and weights in their own precision (a
    LoRA run's merged in, as its checkpoints hold them; a snapshot's over its run's model), its
    tokenizer with its chat template, and a record of where it came from and how its run asked
    and sampled it."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):  # said before the model loads
        raise UserError(f"'{out}' already exists and is not an empty directory: export into a new one.")
    try:
        with published_directory(out, "the model") as scratch:
            _save_model(model, scratch)
    except WriteError as err:
        raise UserError(f"{err} Nothing was written there: free space, or export into another directory.") from None
    return out


def _write_model(model: ModelSpec, out: Path) -> Path:
    """`model` exported into SELFPLAY_HOME's cache (`converted_once`, which reports a failed write)."""
    with built_in_place(out) as scratch:  # never a half-written model at `out`
        _save_model(model, scratch)
    return out


def _save_model(model: ModelSpec, directory: Path) -> None:
    """`model` as `export` writes it, into `directory`, with the record of where it came from."""
    network, tokenizer = model.network(own_precision=True)
    record = {"source": model.name, "step": model.step}
    if model.weights is not None:
        record["source_sha256"] = file_sha256(model.weights_file())
    if model.trained_with is not None:
        record["rollout"] = asdict(model.trained_with)
    network.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    record["sha256"] = file_checksums(directory)
    (directory / BUILD_INFO).write_text(json.dumps(record, indent=2) + "\n")
    set_file_permissions_from_directory(directory)
