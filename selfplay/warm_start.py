"""Warm-starting the default model: supervised fine-tuning on random legal play.

Reinforcement learning from a pretrained base model starts from a policy that already writes
well-formed answers. The default model is built from scratch, so it gets there here: it is
fine-tuned to imitate a *random legal* player of every game of its recipe (`RECIPE_GAMES`), in
both observation modes and both prompt styles, so that it writes `\\boxed{move}` with a legal
move and then stops, while its choice among the legal moves stays broad. Learning which legal move is a
good one is left to RL.

The random player is *tilted*: in each state it prefers some legal moves to others, by random
preferences drawn from the text of that state. A uniform player's moves do not depend on what
it sees beyond the legal moves, so imitating one teaches a model to ignore the rest of the
state (its Kuhn Poker card, say), and RL then starts from a policy that cannot tell states
apart. Matching the tilt takes reading the state; the preferences are random, so no strategy
is taught.

Prompts are rendered with `selfplay.prompts`, exactly as the rollout engine renders them.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from selfplay.prompts import (
    PROMPT_STYLES,
    Message,
    ObservationMode,
    PromptStyle,
    batch_prompt_ids,
    opening_messages,
    prompt_ids,
    state_message,
)
from selfplay.untrained_model import RECIPE_GAMES, build_untrained

EOS_TOKEN = "<|im_end|>"
# Share of multi-turn examples: a chat holds every state a player saw and every move it made.
MULTI_TURN_SHARE = 0.125
# Share of examples in the view prompt style (the state alone). They are short, so they take
# about a quarter of the build's tokens (from 17% in Kuhn Poker to 34% in Connect Four).
VIEW_SHARE = 0.5
# Longer multi-turn chats fall back to a single-turn prompt (training cost grows with length).
MAX_PROMPT_TOKENS = 768
# The build settings of the default model: 11 to 30 minutes on two CPU cores.
STEPS = 1200
BATCH_SIZE = 16
LR = 1e-3
# The build's precision. bf16 (autocast) halves its time on CPUs with bfloat16 instructions,
# but a bf16 build of 1800 steps, though it named more legal moves in 8 of 9 games, learned
# TicTacToe far worse under RL (one run each: 0.07 -> 0.12 non-loss against random, where this
# model goes from 0.10 to 0.51 with the same training).
PRECISION = "fp32"
# The size of an average example (prompt and response), for sizing batches by tokens.
EXAMPLE_TOKENS = 360
# Spread of the random player's preferences in each state: move probabilities are a softmax
# of TILT times standard normal draws (TILT 1 puts most probabilities within 3x of each other).
TILT = 1.0
# Share of training batches per game: the most for the quickstart's TicTacToe and for
# Negotiation's many kinds of offer; the role games write free text.
GAME_WEIGHTS = {
    "tictactoe": 3.0,
    "connect_four": 1.0,
    "kuhn_poker": 1.0,
    "leduc_holdem": 1.0,
    "liars_dice": 1.0,
    "nim": 1.5,
    "negotiation": 2.5,
    "proposer_solver": 1.5,
    "secret_keeping": 1.5,
}


@dataclass(frozen=True)
class Decision:
    """One move of random legal play, as the mover's chat would show it."""

    game: str
    mode: ObservationMode
    style: PromptStyle
    messages: list[Message]  # ends with the user message holding the current state
    move: str
    answer: str  # the move in the game's answer format, e.g. "\\boxed{4}"
    legal_moves: tuple[str, ...]
    legal_answers: tuple[str, ...]  # every legal move in the answer format
    move_probs: tuple[float, ...]  # the random player's probability of each legal move


def tilted_probs(state: str, n_moves: int, seed: int, tilt: float = TILT) -> list[float]:
    """The tilted random player's probabilities of its `n_moves` legal moves in `state` (the
    mover's view as text): a softmax of `tilt` times standard normal draws seeded by the state
    and `seed`, so a state always gets the same preferences. `tilt` 0 is uniform."""
    rng = random.Random(f"{seed}|{state}")
    logits = [tilt * rng.gauss(0.0, 1.0) for _ in range(n_moves)]
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    total = sum(weights)
    return [w / total for w in weights]


def random_legal_play(
    seed: int = 0,
    games: Sequence[str] | None = None,
    multi_turn_share: float = MULTI_TURN_SHARE,
    tilt: float = TILT,
    view_share: float = VIEW_SHARE,
) -> Iterator[Decision]:
    """Endless decisions of tilted random legal players (`tilted_probs` with `tilt`), cycling through
    `games` (the default model's, `RECIPE_GAMES`, by default) one move at a time so each game gets
    an equal share.

    Each player's chat is kept for the whole episode, in each prompt style; a decision is shown
    in the view style with probability `view_share`, else the full style, and as a multi-turn
    chat with probability `multi_turn_share` (when the player has moved before), else single-turn.
    """
    from selfplay.games import make_env

    names = list(games or RECIPE_GAMES)
    rng = random.Random(seed)
    envs = {name: make_env(name) for name in names}
    chats: dict[str, dict[str, list[Message]]] = {}

    def new_episode(name: str) -> None:
        env = envs[name]
        env.reset(seed=rng.randrange(2**31))
        chats[name] = {agent: {style: [] for style in PROMPT_STYLES} for agent in env.possible_agents}

    for name in names:
        new_episode(name)
    while True:
        for name in names:
            env = envs[name]
            agent = env.agent_selection
            observation = env.observe(agent)
            player_chats = chats[name][agent]
            style = "view" if rng.random() < view_share else "full"
            multi = bool(player_chats[style]) and rng.random() < multi_turn_share
            for chat_style, chat in player_chats.items():
                if chat:
                    chat.append(state_message(observation, chat_style))
                else:
                    chat.extend(opening_messages(observation, chat_style))
            legal = tuple(env.legal_moves())
            probs = tuple(tilted_probs(observation["state"], len(legal), seed, tilt))
            move = rng.choices(legal, weights=probs)[0]
            answer = env.answer(move)
            messages = list(player_chats[style]) if multi else opening_messages(observation, style)
            answers = tuple(env.answer(m) for m in legal)
            mode = "multi_turn" if multi else "single_turn"
            yield Decision(name, mode, style, messages, move, answer, legal, answers, probs)
            for chat in player_chats.values():
                chat.append({"role": "assistant", "content": answer})
            env.step(answer)
            if env.end_reason is not None:
                new_episode(name)


def _encode(decision: Decision, tokenizer, eos: int, max_prompt_tokens: int) -> tuple[list[int], list[int]]:
    prompt = prompt_ids(tokenizer, decision.messages)
    if len(prompt) > max_prompt_tokens and decision.mode == "multi_turn":
        rules = [m for m in decision.messages[:1] if m["role"] == "system"]
        prompt = prompt_ids(tokenizer, [*rules, decision.messages[-1]])
    response = tokenizer(decision.answer, add_special_tokens=False)["input_ids"] + [eos]
    return prompt, response


def legal_play_examples(
    seed: int,
    tokenizer,
    *,
    games: Sequence[str] | None = None,
    multi_turn_share: float = MULTI_TURN_SHARE,
    max_prompt_tokens: int = MAX_PROMPT_TOKENS,
) -> Iterator[tuple[list[int], list[int]]]:
    """Endless (prompt_ids, response_ids) pairs from `random_legal_play`: the prompt as the
    rollout engine renders it, the response the answer text followed by the end-of-turn
    token, so the model learns to stop. A multi-turn chat longer than `max_prompt_tokens`
    is shown single-turn instead."""
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    for decision in random_legal_play(seed, games, multi_turn_share):
        yield _encode(decision, tokenizer, eos, max_prompt_tokens)


SoftTargets = list[tuple[tuple[int, ...], tuple[float, ...]]]


def policy_targets(response: list[int], legal_responses: list[list[int]], probs: Sequence[float]) -> SoftTargets:
    """The random legal player's next-token distribution at each token of `response`: at
    position j, the probability mass of the legal responses that agree with `response` before
    j and continue with each token (`probs` being each legal response's probability). Training
    on these instead of the sampled token alone gives the same optimum with far less noise."""
    alive = list(zip(legal_responses, probs))
    targets = []
    for j, token in enumerate(response):
        mass: Counter = Counter()
        for r, p in alive:
            if len(r) > j:
                mass[r[j]] += p
        total = sum(mass.values())
        targets.append((tuple(mass), tuple(m / total for m in mass.values())))
        alive = [(r, p) for r, p in alive if len(r) > j and r[j] == token]
    return targets


def _training_examples(
    seed: int, tokenizer, games: Sequence[str], tilt: float = TILT, max_prompt_tokens: int = MAX_PROMPT_TOKENS
) -> Iterator[tuple[list[int], list[int], SoftTargets]]:
    """`legal_play_examples` with the random legal player's distribution at every response token."""
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    encoded: dict[str, list[int]] = {}  # answers recur (a game has few distinct moves)
    for decision in random_legal_play(seed, games, tilt=tilt):
        prompt, response = _encode(decision, tokenizer, eos, max_prompt_tokens)
        new = [a for a in decision.legal_answers if a not in encoded]
        if new:
            for answer, ids in zip(new, tokenizer(new, add_special_tokens=False)["input_ids"]):
                encoded[answer] = ids + [eos]
        legal = [encoded[a] for a in decision.legal_answers]
        yield prompt, response, policy_targets(response, legal, decision.move_probs)


# -- supervised fine-tuning ---------------------------------------------------------------------


def _batches(seed: int, tokenizer, batch_size: int, games: dict[str, float], tilt: float, pool: int = 256):
    """Endless batches, each of one game (so its prompts share the rules as a prefix), games
    drawn in proportion to `games`' weights. Batches are sized by tokens: about `batch_size`
    examples of `EXAMPLE_TOKENS` tokens each, so games with short prompts get more examples
    per batch and every step costs about the same. Within a game, `pool` examples at a time
    are sorted by length and cut into batches, so little compute goes on padding."""
    names = list(games)
    rng = random.Random(seed)
    streams = {name: _training_examples(seed * 1000 + i, tokenizer, [name], tilt) for i, name in enumerate(names)}
    queued: dict[str, list] = {name: [] for name in names}
    budget = batch_size * EXAMPLE_TOKENS
    while True:
        name = rng.choices(names, weights=[games[n] for n in names])[0]
        if not queued[name]:
            chunk = [next(streams[name]) for _ in range(pool)]
            chunk.sort(key=lambda example: len(example[0]) + len(example[1]))
            batches, current = [], []
            for example in chunk:  # the longest of its batch so far, the chunk being sorted
                if current and (len(current) + 1) * (len(example[0]) + len(example[1])) > budget:
                    batches.append(current)
                    current = []
                current.append(example)
            batches.append(current)
            rng.shuffle(batches)
            queued[name] = batches
        yield queued[name].pop()


def _loss(model, batch: list[tuple[list[int], list[int], SoftTargets]]):
    """Cross-entropy of the model's next-token distribution at the response positions against
    the target distributions, and the KL divergence (the part above the targets' entropy)."""
    import torch

    from selfplay.scoring import response_hidden

    prompts, responses, soft = zip(*batch)
    hidden = response_hidden(model, prompts, responses)
    logprobs = torch.log_softmax(model.get_output_embeddings()(hidden).float(), dim=-1)
    targets = torch.zeros_like(logprobs)
    position = 0
    for example in soft:
        for ids, probs in example:
            targets[position, list(ids)] = torch.tensor(probs)
            position += 1
    cross_entropy = -(targets * logprobs).sum(-1).mean()
    entropy = -(targets * torch.log(targets.clamp_min(1e-12))).sum(-1).mean()
    return cross_entropy, (cross_entropy - entropy).detach()


def warm_start(
    model_dir: str | Path,
    out_dir: str | Path | None = None,
    *,
    steps: int = STEPS,
    batch_size: int = BATCH_SIZE,
    lr: float = LR,
    warmup: float = 0.05,
    weight_decay: float = 0.01,
    max_grad_norm: float = 1.0,
    seed: int = 0,
    games: dict[str, float] | None = None,
    tilt: float = TILT,
    precision: str = PRECISION,
    progress: bool = True,
) -> dict:
    """Fine-tune the model in `model_dir` on random legal play (loss on response tokens only):
    AdamW, linear warm-up then cosine decay to a tenth of `lr`, gradient clipping; `tilt` is
    the random player's spread (`tilted_probs`; 0 imitates a uniform player); `precision`
    "bf16" runs the matrix products in bfloat16 (autocast; the weights stay fp32). The same seed
    gives the same weights. Saves a Hugging Face model directory (safetensors and
    tokenizer) to `out_dir`, or back to `model_dir`; returns the losses and the time taken."""
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from selfplay.scoring import autocast

    started = time.perf_counter()
    model_dir = Path(model_dir)
    out_dir = Path(out_dir) if out_dir is not None else model_dir
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    torch.manual_seed(seed)

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.98),
    )
    warmup_steps = max(1, int(warmup * steps))

    def schedule(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress_ = (step - warmup_steps) / max(1, steps - warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress_))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    weights = dict(GAME_WEIGHTS) if games is None else dict(games)
    batches = _batches(seed, tokenizer, batch_size, weights, tilt)

    losses = []
    bar = tqdm(range(steps), desc="warm start", unit="step", disable=not progress)
    for _ in bar:
        with autocast(precision, "cpu"):
            loss, kl = _loss(model, next(batches))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        scheduler.step()
        losses.append(kl.item())
        bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")

    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return {"losses": losses, "seconds": time.perf_counter() - started}


# -- measuring -----------------------------------------------------------------------------------


def random_positions(game: str, n: int, seed: int = 0) -> Iterator:
    """`n` environments, each at a uniformly chosen decision point of a random legal game."""
    from selfplay.games import make_env

    rng = random.Random(f"positions-{game}-{seed}")
    for _ in range(n):
        env_seed = rng.randrange(2**31)
        env = make_env(game)
        env.reset(seed=env_seed)
        moves = []
        while env.end_reason is None:
            moves.append(rng.choice(env.legal_moves()))
            env.step(env.answer(moves[-1]))
        env.reset(seed=env_seed)
        for move in moves[: rng.randrange(len(moves))]:
            env.step(env.answer(move))
        yield env


def sample_moves(
    backend, game: str, n: int = 200, seed: int = 0, temperature: float = 1.0, prompt: PromptStyle = "full"
) -> list[str | None]:
    """The move a policy backend names at each of `n` random positions of `game` (single-turn
    prompts in style `prompt`, at most 16 new tokens); None where its output names no legal move."""
    from selfplay.backends import SamplingSettings

    envs = list(random_positions(game, n, seed))
    conversations = [opening_messages(env.observe(env.agent_selection), prompt) for env in envs]
    prompts = batch_prompt_ids(backend.tokenizer, conversations)
    generations = backend.generate(prompts, SamplingSettings(max_new_tokens=16, temperature=temperature, seed=seed))
    return [env.parse(g.text) if g.finish_reason == "stop" else None for env, g in zip(envs, generations)]


def legal_move_rate(backend, game: str, n: int = 200, seed: int = 0) -> float:
    """Share of `n` random positions of `game` where the policy, sampling at temperature 1.0,
    names a legal move."""
    moves = sample_moves(backend, game, n, seed)
    return sum(move is not None for move in moves) / len(moves)


def move_spread(moves: Sequence[str | None]) -> dict:
    """How broad a sample of moves is: distinct legal moves named and the top move's share."""
    named = Counter(m for m in moves if m is not None)
    total = sum(named.values())
    top = named.most_common(1)[0][1] / total if total else 0.0
    return {"distinct": len(named), "top_share": top}


def report(model_dir: str | Path, n: int = 200, seed: int = 0, games: Sequence[str] | None = None) -> dict:
    """Legal-move rate and move spread of the model in `model_dir` on each game of the default
    model's recipe, in each prompt style."""
    from selfplay.backends.hf_backend import HFBackend

    backend = HFBackend(str(model_dir))
    rows = {}
    for game in games or RECIPE_GAMES:
        for style in PROMPT_STYLES:
            moves = sample_moves(backend, game, n, seed, prompt=style)
            rows[f"{game}/{style}"] = {"legal": sum(m is not None for m in moves) / n, **move_spread(moves)}
    return rows


def _game_weight(text: str) -> tuple[str, float]:
    name, _, weight = text.partition("=")
    return name, float(weight or 1.0)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Warm-start a model on random legal play, or measure one.")
    parser.add_argument("model_dir")
    parser.add_argument("--out", default=None)
    parser.add_argument("--untrained", action="store_true", help="first write an untrained default model to model_dir")
    parser.add_argument(
        "--games", nargs="+", type=_game_weight, default=None, help="GAME=WEIGHT ... (default: the default model's mix)"
    )
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    parser.add_argument("--lr", type=float, default=LR)
    parser.add_argument("--tilt", type=float, default=TILT, help="the random player's spread; 0 is uniform")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default=PRECISION)
    parser.add_argument("--measure-only", action="store_true")
    parser.add_argument("--n", type=int, default=200)
    args = parser.parse_args()
    if not args.measure_only:
        from selfplay.scoring import warn_if_bf16_emulated

        warn_if_bf16_emulated({"--precision": (args.precision, "cpu")})
    games = dict(args.games) if args.games else None
    target = args.model_dir
    if args.untrained:
        build_untrained(Path(args.model_dir), seed=args.seed)
    if not args.measure_only:
        result = warm_start(
            args.model_dir,
            args.out,
            steps=args.steps,
            batch_size=args.batch_size,
            lr=args.lr,
            seed=args.seed,
            games=games,
            tilt=args.tilt,
            precision=args.precision,
        )
        print(f"trained in {result['seconds']:.1f}s, final loss {sum(result['losses'][-20:]) / 20:.4f}")
        target = args.out or args.model_dir
    print(json.dumps(report(target, n=args.n, games=list(games) if games else None), indent=1))
