"""Turning game observations into model prompts.

Two observation modes, as in the systems we compare with:

- `single_turn` (SPIRAL): every move gets a fresh prompt, the rules as the system message
  and the current state as the user message;
- `multi_turn` (MARS): each player keeps one chat for the whole game, the rules as the
  system message, then every state it saw and every reply it gave.

A tokenizer with a chat template renders the messages with it; one without gets a plain
"role: content" transcript ending in "assistant:".
"""

from __future__ import annotations

from typing import Literal

ObservationMode = Literal["single_turn", "multi_turn"]
Message = dict[str, str]


def opening_messages(observation: dict) -> list[Message]:
    return [{"role": "system", "content": observation["rules"]}, {"role": "user", "content": observation["state"]}]


def plain_prompt(messages: list[Message]) -> str:
    return "".join(f"{m['role']}: {m['content']}\n\n" for m in messages) + "assistant:"


def prompt_ids(tokenizer, messages: list[Message]) -> list[int]:
    """Token ids of `messages` followed by the cue for the assistant's reply."""
    return batch_prompt_ids(tokenizer, [messages])[0]


def batch_prompt_ids(tokenizer, conversations: list[list[Message]]) -> list[list[int]]:
    """`prompt_ids` of many conversations, tokenized in one (parallel) call."""
    if tokenizer.chat_template:
        texts = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in conversations]
    else:
        texts = [plain_prompt(m) for m in conversations]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]
