"""The built-in default model, built offline.

No model hub is reachable on the machines selfplay must run on, so the default model is made
here: a byte-level BPE tokenizer trained on the text of selfplay's own games, with a ChatML
chat template, and a small Qwen2 causal LM (head size 64, which vLLM's CPU backend supports),
saved as an ordinary Hugging Face model directory. `model: default` names it; any Hugging
Face model name or local path works through the same setting.

Like a pretrained base model, the default model starts out writing well-formed answers: it is
warm-started on random legal play (`selfplay.warm_start`), once, and cached under
SELFPLAY_HOME.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

from selfplay.errors import UserError

DEFAULT_MODEL = "default"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
VOCAB_SIZE = 2048
# Small enough to train on two CPU cores in minutes; head size 64 for vLLM's CPU backend. Four
# heads, not two: at half this width the model never learned to copy a legal move from the
# prompt within the warm start's budget.
MODEL_SHAPE = dict(
    hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4
)
MAX_POSITIONS = 8192
# Bumped whenever the recipe changes, so that a cached default model is rebuilt.
DEFAULT_MODEL_VERSION = 7
BUILD_INFO = "selfplay_build.json"


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
    path = default_model_dir()
    if not is_current_build(path):
        with _build_lock(path):
            if not is_current_build(path):  # another process may have built it meanwhile
                from selfplay.warm_start import build_default_model

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


def game_corpus(games_per_game: int = 40, seed: int = 0) -> Iterator[str]:
    """Rules, states and answers from random legal play of every native game."""
    from selfplay.games import make_env
    from selfplay.games.registry import NATIVE_GAMES

    rng = random.Random(seed)
    for name in NATIVE_GAMES:
        env = make_env(name)
        yield env.game.rules
        for episode in range(games_per_game):
            env.reset(seed=seed + episode)
            while env.end_reason is None:
                yield env.observe(env.agent_selection)["state"]
                env.step(env.answer(rng.choice(env.legal_moves())))


def build_tokenizer(corpus: Iterator[str], vocab_size: int = VOCAB_SIZE):
    """A byte-level BPE tokenizer (any text encodes) with the ChatML special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    # Digits stand alone (as in Llama's and Qwen's tokenizers), so a cell or a count reads the
    # same token in the board, the list of legal moves and the answer: copying a legal move is
    # then an identity map, which a small model learns quickly.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML_TEMPLATE,
    )


def build_untrained(out_dir: Path, seed: int = 0) -> Path:
    """Tokenizer plus a randomly initialised Qwen2 model, saved to `out_dir`."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

    tokenizer = build_tokenizer(game_corpus(seed=seed))
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=pad,
        eos_token_id=eos,
        pad_token_id=pad,
        **MODEL_SHAPE,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=[eos, pad], pad_token_id=pad, bos_token_id=pad)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir
