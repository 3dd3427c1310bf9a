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
    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    else:
        text = plain_prompt(messages)
    return tokenizer(text, add_special_tokens=False)["input_ids"]
