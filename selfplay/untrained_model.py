"""The default model before its warm start, built offline: a byte-level BPE tokenizer trained on
the text of selfplay's own games, with a ChatML chat template, and a randomly initialised small
Qwen2 causal LM (head size 64, which vLLM's CPU backend supports), saved as an ordinary Hugging
Face model directory. The tests use it as their tiny model; `selfplay.default_model` warm-starts
it into the `default` model.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

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


# The games the default model's tokenizer and warm start cover: the built-in games of its build.
# A built-in game added since is not among them, so that adding one leaves the recipe (and the
# shipped model it must rebuild) as it was.
RECIPE_GAMES = (
    "tictactoe",
    "connect_four",
    "kuhn_poker",
    "leduc_holdem",
    "liars_dice",
    "nim",
    "negotiation",
    "secret_keeping",
    "proposer_solver",
)


def game_corpus(games_per_game: int = 40, seed: int = 0) -> Iterator[str]:
    """Rules, states and answers from random legal play of every game of the recipe."""
    from selfplay.games import make_env

    rng = random.Random(seed)
    for name in RECIPE_GAMES:
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
