"""Turning game observations into model prompts.

Two observation modes, as in the systems we compare with:

- `single_turn` (SPIRAL): every move gets a fresh prompt, the rules as the system message
  and the current state as the user message;
- `multi_turn` (MARS): each player keeps one chat for the whole game, the rules as the
  system message, then every state it saw and every reply it gave.

A tokenizer with a chat template renders the messages with it; one without gets a plain
"role: content" transcript ending in "assistant:".

Two prompt styles:

- `full`: the rules as the system message; the state message holds the player's view, the
  legal moves and the answer instruction. What a pretrained model needs to play from text.
- `view`: the player's view of the state alone as the user message (`TextGame.describe`), no
  rules, move list or instruction. For a small model trained from scratch, which learns the
  game from rewards: context that never changes only slows its learning (a TicTacToe board
  after 110 tokens of rules is learned far slower than the board alone; see
  configs/tictactoe.yaml). With `decoding: legal` the model needs no answer instruction.
"""

from __future__ import annotations

from typing import Literal, get_args

ObservationMode = Literal["single_turn", "multi_turn"]
PromptStyle = Literal["full", "view"]
PROMPT_STYLES: tuple[str, ...] = get_args(PromptStyle)
Message = dict[str, str]


def opening_messages(observation: dict, style: PromptStyle = "full") -> list[Message]:
    """The first messages of a player's chat: the rules (in the full style) and the state."""
    rules = [{"role": "system", "content": observation["rules"]}] if style == "full" else []
    return [*rules, state_message(observation, style)]


def state_message(observation: dict, style: PromptStyle = "full") -> Message:
    """The user message showing the current state, as each later turn of a multi-turn chat adds it."""
    return {"role": "user", "content": observation["state" if style == "full" else "view"]}


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
