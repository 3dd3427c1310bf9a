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
setting.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from selfplay.errors import UserError
from selfplay.untrained_model import build_untrained
from selfplay.warm_start import BATCH_SIZE, LR, PRECISION, STEPS, TILT, VIEW_SHARE, warm_start

DEFAULT_MODEL = "default"
# Bumped whenever the recipe changes (here, in `untrained_model` or in `warm_start`), so that a
# cached default model is rebuilt.
DEFAULT_MODEL_VERSION = 7
BUILD_INFO = "selfplay_build.json"
SHIPPED_MODEL = Path(__file__).parent / "models" / DEFAULT_MODEL
_verified: set[Path] = set()  # shipped models whose checksums this process has checked


def selfplay_home() -> Path:
    return Path(os.environ.get("SELFPLAY_HOME", Path.home() / ".cache" / "selfplay"))


def default_model_dir() -> Path:
    return selfplay_home() / "models" / DEFAULT_MODEL


def resolve_model(name_or_path: str) -> str:
    """A loadable model name or path; `default` is built on first use (a few minutes, once).
    Raises UserError, before anything loads the model, if there is no such model."""
    if name_or_path != DEFAULT_MODEL:
        _check_model(name_or_path)
        return name_or_path
    if is_current_build(SHIPPED_MODEL):
        verify_checksums(SHIPPED_MODEL)
        return str(SHIPPED_MODEL)
    path = default_model_dir()
    if not is_current_build(path):
        with _build_lock(path):
            if not is_current_build(path):  # another process may have built it meanwhile
                build_default_model(path)
    return str(path)


def _check_model(name_or_path: str) -> None:
    """That `name_or_path` is a model directory, or a model the Hugging Face hub (or its local
    cache) holds: that its configuration loads."""
    from transformers import AutoConfig

    path = Path(name_or_path)
    if path.is_dir() and not (path / "config.json").is_file():
        raise UserError(
            f"'{name_or_path}' is a directory but not a model: it has no config.json. Give a model directory "
            "(a run's are its checkpoints/step-N), a model name the hub serves, or default."
        )
    try:
        AutoConfig.from_pretrained(name_or_path)
    except (OSError, ValueError) as err:
        if path.is_dir():
            raise UserError(f"Cannot read the model in '{name_or_path}': {' '.join(str(err).split())}") from None
        raise UserError(
            f"No model '{name_or_path}': it is not a model directory, and neither the Hugging Face hub nor its "
            "cache here has a model of that name. Give a model directory, a model name the hub serves, or default."
        ) from None


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
    return {file.name: _sha256(file) for file in files}


def _sha256(file: Path) -> str:
    return hashlib.sha256(file.read_bytes()).hexdigest()


def verify_checksums(path: Path) -> None:
    """That the model files in `path` are the ones its build recorded; raises UserError naming the
    first that is missing or changed."""
    path = Path(path)
    if path in _verified:
        return
    recorded = json.loads((path / BUILD_INFO).read_text()).get("sha256", {})
    for name, digest in recorded.items():
        file = path / name
        problem = "missing" if not file.is_file() else None
        if problem is None and _sha256(file) != digest:
            problem = "changed"
        if problem:
            raise UserError(
                f"The default model in '{path}' is damaged: {name} is {problem}. "
                "Reinstall selfplay (in a clone: git checkout selfplay/models/default), or rebuild it with "
                f"`python -m selfplay.default_model {path}`."
            )
    _verified.add(path)


@contextlib.contextmanager
def _build_lock(path: Path):
    """An exclusive lock beside `path`, so that concurrent processes build it once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: build without a lock
        yield
        return
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


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
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
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
            "sha256": file_checksums(scratch),
        }
        (scratch / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        scratch.rename(out_dir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out_dir


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Build the default model (the recipe above) into OUT_DIR.")
    parser.add_argument("out_dir", help="where the model goes, e.g. selfplay/models/default to rebuild the shipped one")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"warm-start steps (default {STEPS})")
    args = parser.parse_args()
    print(build_default_model(args.out_dir, steps=args.steps))
