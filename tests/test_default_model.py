"""The default model ships with the package, checked at load; its recipe still builds it."""

from __future__ import annotations

import hashlib
import json
import shutil
import tracemalloc

import pytest

from selfplay import default_model
from selfplay.backends import SamplingSettings
from selfplay.default_model import (
    ASKED_WITH,
    BUILD_INFO,
    SHIPPED_MODEL,
    build_default_model,
    is_current_build,
    resolve_model,
    verify_checksums,
)
from selfplay.errors import UserError
from selfplay.files import HASH_CHUNK_BYTES, file_sha256
from selfplay.match import play_series
from selfplay.rollouts import RolloutSettings


def test_default_names_the_shipped_model_without_building_it(monkeypatch, tmp_path):
    monkeypatch.setenv("SELFPLAY_HOME", str(tmp_path))

    def refuse(path, **options):
        raise AssertionError("the shipped default model was rebuilt")

    monkeypatch.setattr(default_model, "build_default_model", refuse)
    assert is_current_build(SHIPPED_MODEL)
    assert resolve_model("default") == str(SHIPPED_MODEL)
    assert set(json.loads((SHIPPED_MODEL / BUILD_INFO).read_text())["sha256"]) >= {"model.safetensors", "config.json"}


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        ("changed", "tokenizer.json is changed"),
        ("missing", "tokenizer.json is missing"),
        ("added", r"adapter_config.json is not one of its files \(delete it\)"),
    ],
)
def test_a_damaged_file_of_the_default_model_is_named_with_the_fix(tmp_path, damage, named):
    """A file the build did not make counts too: transformers reads `adapter_config.json`, for
    one, as making the directory a LoRA adapter."""
    copy = shutil.copytree(SHIPPED_MODEL, tmp_path / "default")
    if damage == "changed":
        with open(copy / "tokenizer.json", "a") as file:
            file.write(" ")
    elif damage == "missing":
        (copy / "tokenizer.json").unlink()
    else:
        (copy / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    with pytest.raises(UserError, match=rf"{named}.*python -m selfplay.default_model"):
        verify_checksums(copy)


def test_a_file_is_hashed_a_chunk_at_a_time(tmp_path):
    """Model files run to gigabytes: hashing one holds a chunk of it in memory, not all of it."""
    size = 64 * 2**20
    sparse = tmp_path / "model.gguf"
    with open(sparse, "wb") as file:
        file.truncate(size)
    tracemalloc.start()
    try:
        digest = file_sha256(sparse)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert digest == hashlib.sha256(bytes(size)).hexdigest()
    assert peak < 4 * HASH_CHUNK_BYTES  # a chunk or two, of the 64 the file holds


def test_the_shipped_model_writes_legal_moves():
    """Kuhn Poker's moves are legal in every state; TicTacToe's only where a cell is empty, and the
    model does not read the board yet (README), so there only its opening moves count."""
    greedy = RolloutSettings(sampling=SamplingSettings(max_new_tokens=16, temperature=0.0))
    model = f"model:{SHIPPED_MODEL}"
    poker = play_series("kuhn_poker", [model, "random"], 8, seed=0, rollout=greedy, progress=False)
    assert sum(r.invalid_moves[r.players.index(model)] for r in poker) == 0
    openings = play_series("tictactoe", [model, "random"], 8, seed=0, rollout=greedy, progress=False)
    first_moves = [r for r in openings if r.players[0] == model]
    assert first_moves and all(r.turns > 1 or r.end_reason != "invalid_move" for r in first_moves)


@pytest.mark.slow
def test_the_recipe_still_builds_a_model_of_the_shipped_shape(tmp_path):
    built = build_default_model(tmp_path / "default", steps=2, progress=False)
    shape_keys = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    shipped, rebuilt = (json.loads((path / "config.json").read_text()) for path in (SHIPPED_MODEL, built))
    assert {key: rebuilt[key] for key in shape_keys} == {key: shipped[key] for key in shape_keys}
    assert rebuilt["vocab_size"] == shipped["vocab_size"]
    assert is_current_build(built)
    verify_checksums(built)  # the build records its files' checksums
    assert json.loads((built / BUILD_INFO).read_text())["rollout"] == ASKED_WITH
