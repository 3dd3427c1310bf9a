"""How fast can a language model learn TicTacToe's one-move tactics when it is told the answer?

`experiments/tabular_ceiling.py` bounds what training reaches from the games' side: a policy that
tells every board apart. This script bounds it from the model's side. It trains the model by
cross-entropy on labelled positions: where a move wins at once, the winning moves; else, where
some moves leave the opponent a win at once, the moves that do not
(`selfplay.evaluation.exact_play.tactical_moves`). The probability of the labelled set is read
under legal decoding, as training samples it. Every `--every` steps it prints the model's exact
takes_win and stops_loss on held-out positions that it never trains on.

A label names the right moves in one position; a game's outcome is one noisy number for a
whole game. So a model that cannot learn the tactics from N labelled positions will not learn
them from N games of self-play, and its non-loss rate against `random` stays near that of a
player that ignores the board.

References tell a slow model from a hard task or a broken loss:
- beside the model's figures, a small multilayer perceptron that reads the board as OpenSpiel's
  observation tensor, trained on the same positions, batch size and steps;
- `--labels opposite`: the empty cells whose mirror image through the centre holds the
  opponent's mark. Each answer depends on one other cell and on no line, so it measures how fast
  the model learns where the marks are;
- `--labels lowest-cell`: the lowest-numbered empty cell. Under legal decoding a fixed preference
  for low numbers gives it without reading the board, so it checks the loss, the scoring and the
  optimiser, not the model's reading.

`--read-first N` first trains the model for N steps to write what each cell of the board holds
(`0X1-2O...`, asked for after the game's own prompt) on boards outside the held-out positions,
and prints how often it reads right on 500 boards it never trained on. The labels that follow
then show whether a model that knows where the marks are learns the tactics any faster.

`--prompt board` asks with the board alone (`0XX3OO6XOX`: nine cells, an empty one showing its
number, then the mark to move) instead of the game's prompt of about 190 tokens, which tells a
model that cannot learn the tactics from one that cannot learn them inside a long prompt.
`--prompt rules-board` puts the game's rules (about 110 tokens that never change) before the
board as the system message, and `--sliding-window N` lets every layer attend to its last N
tokens only: together they tell whether what slows a model is the prompt's length as such.
`--prompt view` asks with the game's own prompt in the view style (`rollout.prompt: view`: the
board as the game describes it, no rules, move list or instruction).
A window changes what a trained model computes, so compare windows on untrained weights
(`python -m selfplay.warm_start DIR --untrained --measure-only` writes the default model's
untrained weights to DIR).

    python experiments/supervised_ceiling.py --steps 300 --batch-size 32 --lr 3e-4
    python experiments/supervised_ceiling.py --prompt board --steps 1000 --every 250
    python experiments/supervised_ceiling.py --read-first 1500 --steps 500 --every 125
    python experiments/supervised_ceiling.py --model DIR --prompt rules-board --sliding-window 32 --lr 1e-4
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time

import numpy as np
import pyspiel
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from selfplay.default_model import resolve_model
from selfplay.evaluation.exact_play import perfect_information_twin, tactical_moves
from selfplay.evaluation.exploitability import (
    InformationState,
    decision_states,
    information_states,
    model_scorer,
    scored_states,
)
from selfplay.games.tictactoe import MARKS, shown_cells
from selfplay.legal_decoding import Choices, allowed_mask
from selfplay.prompts import PromptStyle, batch_prompt_ids
from selfplay.scoring import autocast, response_logprobs, vocab_size, warn_if_bf16_emulated

GAME = "tictactoe"

Labelled = tuple[InformationState, str, tuple[int, ...]]  # the state, its label kind, its right actions


def labelled_positions(
    spiel_states: dict[str, pyspiel.State], labels: str = "tactics", style: PromptStyle = "full"
) -> list[Labelled]:
    """TicTacToe decision states, asked in prompt style `style`, with their right moves under
    `labels` (see the module's docstring): every state that `labels` names right moves in.
    `spiel_states` are the game's decision states by key (`decision_states`)."""
    label = _LABELS[labels]
    labelled = []
    for state in information_states(GAME, by_state=True, prompt=style):
        found = label(spiel_states[state.key])
        if found is not None:
            kind, right = found
            labelled.append((state, kind, tuple(a for a in state.actions if a in right)))
    return labelled


def _lowest_cell(state: pyspiel.State) -> tuple[str, set[int]] | None:
    """The lowest-numbered empty cell, in the states with a one-move tactic."""
    return None if tactical_moves(state) is None else ("lowest_cell", {min(state.legal_actions())})


def _opposite_cells(state: pyspiel.State) -> tuple[str, set[int]] | None:
    """The empty cells whose mirror image through the centre (cell 8 - k) holds the mark of the
    player not to move, where some but not all empty cells are such."""
    opponent_mark = "ox"[state.current_player()]
    cells = _cells(state)
    legal = state.legal_actions()
    right = {k for k in legal if cells[8 - k] == opponent_mark}
    return ("opposite", right) if 0 < len(right) < len(legal) else None


def _cells(state: pyspiel.State) -> str:
    """The board's nine cells in order, as OpenSpiel prints them: `x`, `o` or `.` when empty."""
    return str(state).replace("\n", "")


_LABELS = {"tactics": tactical_moves, "opposite": _opposite_cells, "lowest-cell": _lowest_cell}


def board_only(state: InformationState, spiel_state: pyspiel.State, with_rules: bool = False) -> InformationState:
    """`state` asked with the board alone as its prompt: nine cells, an empty one showing its
    number, then the mark to move, e.g. `0XX3OO6XOX`; `with_rules` puts the game's rules
    before it as the system message, as the game's own prompt does."""
    cells = "".join(shown_cells(_cells(spiel_state)))
    rules = [message for message in state.messages if message["role"] == "system"] if with_rules else []
    return dataclasses.replace(state, messages=[*rules, {"role": "user", "content": cells + MARKS[state.player]}])


def load_model(path: str, sliding_window: int | None = None):
    """The model at `path` in float32; with `sliding_window`, every layer attends to that many
    most recent tokens only (a Qwen2-style config's sliding-window attention)."""
    if sliding_window is None:
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    config = AutoConfig.from_pretrained(path)
    if not hasattr(config, "layer_types") or not hasattr(config, "sliding_window"):
        raise SystemExit(f"--sliding-window: {config.model_type} models have no sliding-window attention")
    config.sliding_window = sliding_window
    config.layer_types = ["sliding_attention"] * config.num_hidden_layers
    return AutoModelForCausalLM.from_pretrained(path, config=config, dtype=torch.float32)


def mean_by_tactic(positions: list[Labelled], right_probability) -> dict[str, float]:
    """Mean of `right_probability(state, right)` over `positions`, per tactic."""
    found: dict[str, list[float]] = {}
    for state, kind, right in positions:
        found.setdefault(kind, []).append(right_probability(state, right))
    return {kind: float(np.mean(values)) for kind, values in sorted(found.items())}


def held_out_tactics(model, tokenizer, positions: list[Labelled]) -> dict[str, float]:
    """Mean probability of a right move, per tactic, under legal decoding."""
    probabilities = scored_states([s for s, _, _ in positions], model_scorer(model, tokenizer, decoding="legal"))
    return mean_by_tactic(positions, lambda state, right: sum(probabilities[state.key][a] for a in right))


def uniform_tactics(positions: list[Labelled]) -> dict[str, float]:
    """What a uniformly random legal move scores on the same positions."""
    return mean_by_tactic(positions, lambda state, right: len(right) / len(state.actions))


# A labelled position tokenized once: its prompt, its right answers, and every legal answer.
Example = tuple[list[int], list[tuple[int, ...]], Choices]
# A board to read, tokenized once: its prompt asking for the cells, and the cells' contents.
Reading = tuple[list[int], list[int]]

READ_REQUEST = "Before you move, write what each cell holds: its number, then X, O or - when empty."
CELL_CONTENT = {"x": "X", "o": "O", ".": "-"}
CELLS = 9


def training_examples(tokenizer, positions: list[Labelled]) -> list[Example]:
    """`positions` as the ids the loss reads, each answer followed by the end-of-turn token."""
    prompts = batch_prompt_ids(tokenizer, [state.messages for state, _, _ in positions])
    texts = sorted({answer for state, _, _ in positions for answer in state.answers})
    eos = tokenizer.eos_token_id
    ids = {t: (*i, eos) for t, i in zip(texts, tokenizer(texts, add_special_tokens=False)["input_ids"])}
    examples = []
    for prompt, (state, _, right) in zip(prompts, positions):
        right_answers = [ids[answer] for answer, action in zip(state.answers, state.actions) if action in right]
        examples.append((prompt, right_answers, tuple(ids[answer] for answer in state.answers)))
    return examples


def right_moves_loss(model, batch: list[Example], precision: str) -> torch.Tensor:
    """Mean over `batch` of -log P(a right move), each move's answer read under legal decoding."""
    prompts, answers, choices = zip(*[(prompt, answer, legal) for prompt, right, legal in batch for answer in right])
    with autocast(precision, "cpu"):
        logprobs = response_logprobs(model, prompts, answers, mask=allowed_mask(answers, choices, vocab_size(model)))
    per_answer = torch.stack([lp.float().sum() for lp in logprobs])
    per_row = [row.logsumexp(0) for row in per_answer.split([len(right) for _, right, _ in batch])]
    return -torch.stack(per_row).mean()


def reading_examples(
    tokenizer, states: list[InformationState], spiel_states: dict[str, pyspiel.State]
) -> list[Reading]:
    """Each board's prompt with `READ_REQUEST` after it, and its answer `0X1-2O...`: a cell's
    number, then its content, each one token, then the end-of-turn token."""
    conversations = []
    for state in states:
        *context, request = state.messages
        conversations.append([*context, {**request, "content": f"{request['content']}\n\n{READ_REQUEST}"}])
    prompts = batch_prompt_ids(tokenizer, conversations)
    answers = [
        "".join(f"{cell}{CELL_CONTENT[mark]}" for cell, mark in enumerate(_cells(spiel_states[s.key]))) for s in states
    ]
    answer_ids = tokenizer(answers, add_special_tokens=False)["input_ids"]
    if any(len(ids) != 2 * CELLS for ids in answer_ids):
        raise ValueError("this tokenizer does not write a cell's number and its content as one token each")
    return [(prompt, [*ids, tokenizer.eos_token_id]) for prompt, ids in zip(prompts, answer_ids)]


def content_logprobs(model, batch: list[Reading], precision: str) -> torch.Tensor:
    """log P(the right content) of each cell of each board in `batch`, teacher-forced: (boards, CELLS)."""
    prompts, answers = zip(*batch)
    with autocast(precision, "cpu"):
        logprobs = response_logprobs(model, prompts, answers)
    return torch.stack([lp.float()[1 : 2 * CELLS : 2] for lp in logprobs])


def reading_loss(model, batch: list[Reading], precision: str) -> torch.Tensor:
    return -content_logprobs(model, batch, precision).mean()


def held_out_reading(model, boards: list[Reading], precision: str) -> str:
    """Mean probability of each cell's right content on `boards`, and the share of boards whose
    every cell the model gives its right content with probability above 1/2."""
    with torch.no_grad():
        probabilities = torch.cat(
            [content_logprobs(model, boards[i : i + 64], precision).exp() for i in range(0, len(boards), 64)]
        )
    read_right = (probabilities > 0.5).all(-1).float().mean()
    return f"cell read right with probability {probabilities.mean():.3f}, whole board {read_right:.3f}"


def train(model, optimizer, examples: list, loss_fn, steps: int, args, held_out_figures) -> None:
    """`steps` AdamW steps on batches sampled from `examples`, printing `held_out_figures(step)`
    before the first and, with the training loss, every `args.every` steps."""
    print(f"step {0:>5}  examples {0:>6}  {'':>14}  held out: {held_out_figures(0)}")
    model.train()
    started, losses = time.perf_counter(), []
    for step in range(1, steps + 1):
        loss = loss_fn(model, random.sample(examples, args.batch_size), args.precision)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if step % args.every == 0 or step == steps:
            seconds = time.perf_counter() - started
            recent = np.mean(losses[-args.every :])
            seen, figures = step * args.batch_size, held_out_figures(step)
            print(f"step {step:>5}  examples {seen:>6}  loss {recent:.3f} {seconds:>5.0f}s  held out: {figures}")


def board_perceptron_figures(
    spiel_states: dict[str, pyspiel.State], train: list[Labelled], held_out: list[Labelled], args
) -> dict[int, str]:
    """Held-out figures, every `args.every` steps, of a perceptron with two hidden layers that
    reads each board as OpenSpiel's observation tensor plus the mover, trained like the model."""

    def tensors(positions: list[Labelled]):
        boards = torch.tensor([[*spiel_states[s.key].observation_tensor(), float(s.player)] for s, _, _ in positions])
        legal, right = torch.zeros(2, len(positions), 9, dtype=torch.bool)
        for row, (state, _, right_actions) in enumerate(positions):
            legal[row, list(state.actions)] = True
            right[row, list(right_actions)] = True
        return boards, legal, right

    def right_probability(boards, legal, right):
        return (perceptron(boards).masked_fill(~legal, float("-inf")).softmax(-1) * right).sum(-1)

    def held_out_figures() -> str:
        with torch.no_grad():
            found = right_probability(held_boards, held_legal, held_right).tolist()
        by_state = {state.key: p for (state, _, _), p in zip(held_out, found)}
        return _figures(mean_by_tactic(held_out, lambda state, _: by_state[state.key]))

    torch.manual_seed(args.seed)
    sampler = random.Random(args.seed)
    train_boards, train_legal, train_right = tensors(train)
    held_boards, held_legal, held_right = tensors(held_out)
    width = train_boards.shape[1]
    layers = [torch.nn.Linear(width, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU()]
    perceptron = torch.nn.Sequential(*layers, torch.nn.Linear(256, 9))
    optimizer = torch.optim.AdamW(perceptron.parameters(), lr=1e-3)
    figures = {}
    for step in range(1, args.steps + 1):
        rows = sampler.sample(range(len(train)), args.batch_size)
        loss = -right_probability(train_boards[rows], train_legal[rows], train_right[rows]).log().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % args.every == 0 or step == args.steps:
            figures[step] = held_out_figures()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default", help="a model name or directory; default: the built-in model")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--every", type=int, default=50, help="steps between held-out measurements")
    parser.add_argument("--held-out", type=float, default=0.5, help="share of positions never trained on")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--labels",
        choices=tuple(_LABELS),
        default="tactics",
        help="what to train on: the one-move tactics, or a control (see the description above)",
    )
    parser.add_argument(
        "--prompt",
        choices=("game", "view", "board", "rules-board"),
        default="game",
        help="the game's own prompt, in the full or the view style; the board alone (nine cells and the mark to "
        "move); or the rules, then the board",
    )
    parser.add_argument(
        "--sliding-window",
        type=int,
        default=None,
        metavar="N",
        help="load the model with every layer attending to the last N tokens only",
    )
    parser.add_argument(
        "--read-first", type=int, default=0, metavar="N", help="steps of board reading before the labels"
    )
    args = parser.parse_args()
    warn_if_bf16_emulated({"--precision": (args.precision, "cpu")})

    random.seed(args.seed)
    torch.manual_seed(args.seed)
    spiel_states = decision_states(perfect_information_twin(GAME), GAME)

    style = "view" if args.prompt == "view" else "full"

    def asked(state: InformationState) -> InformationState:
        if args.prompt in ("game", "view"):
            return state
        return board_only(state, spiel_states[state.key], with_rules=args.prompt == "rules-board")

    labelled = labelled_positions(spiel_states, args.labels, style)
    positions = [(asked(state), kind, right) for state, kind, right in labelled]
    random.shuffle(positions)
    split = int(len(positions) * args.held_out)
    held_out, train_positions = positions[:split], positions[split:]
    perceptron = board_perceptron_figures(spiel_states, train_positions, held_out, args)
    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    examples = training_examples(tokenizer, train_positions)
    model = load_model(path, args.sliding_window)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    if args.read_first:
        held_out_keys = {state.key for state, _, _ in held_out}
        boards = [asked(s) for s in information_states(GAME, by_state=True, prompt=style) if s.key not in held_out_keys]
        random.shuffle(boards)
        readings = reading_examples(tokenizer, boards, spiel_states)
        read_held_out, read_train = readings[:500], readings[500:]
        print(f"reading: {len(read_train)} boards to train on, {len(read_held_out)} held out")
        train(
            model,
            optimizer,
            read_train,
            reading_loss,
            args.read_first,
            args,
            lambda step: held_out_reading(model, read_held_out, args.precision),
        )
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    print(f"{len(positions)} labelled positions ({len(train_positions)} to train on, {len(held_out)} held out)")
    print(f"uniform random legal move on the held-out positions: {_figures(uniform_tactics(held_out))}")

    def held_out_figures(step: int) -> str:
        figures = _figures(held_out_tactics(model, tokenizer, held_out))
        return f"{figures}\n{'':>45}board perceptron: {perceptron[step]}" if step else figures

    train(model, optimizer, examples, right_moves_loss, args.steps, args, held_out_figures)


def _figures(tactics: dict[str, float]) -> str:
    return "  ".join(f"{kind} {value:.3f}" for kind, value in tactics.items())


if __name__ == "__main__":
    main()
