"""What can selfplay's training algorithm reach in a budget of games, with a policy that tells
every state apart?

The policy here is a table: one row of logits per state (Kuhn Poker: information state;
TicTacToe: board), illegal moves masked, so nothing it learns in one state disturbs another.
With `--policy perceptron` it is instead a two-layer perceptron reading each state as
OpenSpiel's tensor, which generalises across states as a language model does, without having
to learn to read text. It is trained the way `selfplay train` trains a language model: each
step plays `--games-per-step` games against opponents drawn from `--opponents` (`self`,
`random`), turns become `Trajectory` records, advantages come from selfplay's own estimator
(`selfplay.advantages.estimate`), and the loss is the learner's PPO-clip loss over
`--minibatches` optimizer steps (one: the on-policy policy gradient) with its token-mean
aggregation, an optional KL penalty to the initial policy (the learner's k3 estimate;
`--reference-every` moves that reference to the current policy, as
`learner.reference_update_every` does), gradient clipping at 1 and Adam, its learning rate on
the learner's schedule (`--lr-schedule`, decaying across `--steps`).

It measures what issue-style targets ask of the language model:
- kuhn_poker: exact exploitability (OpenSpiel); uniform play is 0.458;
- tic_tac_toe: the non-loss rate against `random`, both seats (`--eval-games` games, sampling
  the table's policy, or with `--greedy` playing its most probable move in every state).

A language-model policy pays for the same games with far more compute and must also learn to
read the state, so at the same number of games these figures bound what
`experiments/train_targets.py` shows, apart from what a model generalises across states.

    python experiments/tabular_ceiling.py kuhn_poker --steps 300 --games-per-step 128 --lr 0.01 0.03 --kl 0 0.2
    python experiments/tabular_ceiling.py tic_tac_toe --steps 130 --games-per-step 64 --opponents self random
    python experiments/tabular_ceiling.py tic_tac_toe --policy perceptron --steps 600 --games-per-step 64 \
        --opponents self random --lr 3e-4 1e-3 --kl 0.1 --reference-every 35 --minibatches 4 \
        --turn-discount 0.3 --lr-schedule linear
"""

from __future__ import annotations

import argparse
import itertools
import statistics

import numpy as np
import pyspiel
import torch

from selfplay.advantages import estimate
from selfplay.config import LearnerConfig
from selfplay.evaluation.exploitability import exploitability_of
from selfplay.learner import scheduled_lr
from selfplay.records import MatchResult, Trajectory, Turn


def perfect_information(game) -> bool:
    return game.get_type().information == pyspiel.GameType.Information.PERFECT_INFORMATION


def state_key(state, seat: int) -> str:
    """What the policy conditions on: the board, or the mover's information state."""
    if perfect_information(state.get_game()):
        return state.observation_string(seat)
    return state.information_state_string(seat)


class Table:
    """Logits for every decision state of `game`, illegal moves masked out."""

    def __init__(self, game, tilt: float, generator: torch.Generator):
        self.game = game
        self.index: dict[str, int] = {}
        masks, tensors = [], []
        seen = set()
        frontier = [game.new_initial_state()]
        while frontier:
            state = frontier.pop()
            if state.is_terminal() or str(state) in seen:  # a TicTacToe board is reached by many move orders
                continue
            seen.add(str(state))
            if not state.is_chance_node():
                key = state_key(state, state.current_player())
                if key not in self.index:
                    self.index[key] = len(masks)
                    masks.append(state.legal_actions_mask())
                    tensors.append(state_tensor(state, state.current_player()))
            frontier.extend(state.child(action) for action in state.legal_actions())
        self.legal = torch.tensor(masks, dtype=torch.bool)
        self.tensors = torch.tensor(tensors, dtype=torch.float32)
        self.logits = (tilt * torch.randn(self.legal.shape, generator=generator)).requires_grad_()

    def parameters(self) -> list[torch.Tensor]:
        return [self.logits]

    def scores(self) -> torch.Tensor:
        return self.logits

    def log_probs(self) -> torch.Tensor:
        return torch.log_softmax(self.scores().masked_fill(~self.legal, -torch.inf), dim=-1)

    def probs(self) -> np.ndarray:
        return self.log_probs().detach().exp().numpy()


class Perceptron(Table):
    """A two-layer perceptron over each state's OpenSpiel tensor and the mover, in place of the
    table's rows: what it learns in one state moves its policy in similar ones, as a language
    model's does, but it reads the state as numbers. Initial policy uniform (zero output layer)."""

    def __init__(self, game, width: int, generator: torch.Generator):
        super().__init__(game, 0.0, generator)
        inputs, moves = self.tensors.shape[1], self.legal.shape[1]
        self.net = torch.nn.Sequential(
            torch.nn.Linear(inputs, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU()
        )
        for layer in self.net[::2]:
            torch.nn.init.kaiming_uniform_(layer.weight, nonlinearity="relu", generator=generator)
            torch.nn.init.zeros_(layer.bias)
        self.head = torch.nn.Linear(width, moves)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def parameters(self) -> list[torch.Tensor]:
        return [*self.net.parameters(), *self.head.parameters()]

    def scores(self) -> torch.Tensor:
        return self.head(self.net(self.tensors))


def state_tensor(state, seat: int) -> list[float]:
    """The perceptron's input: the board, or the mover's information state, and the mover."""
    tensor = (
        state.observation_tensor(seat)
        if perfect_information(state.get_game())
        else state.information_state_tensor(seat)
    )
    return [*tensor, *(float(seat == s) for s in range(state.get_game().num_players()))]


def play(table: Table, probs: np.ndarray, opponent: str, learner_seat: int, seed: int, rng: np.random.Generator):
    """One game with the table's `probs`: its Trajectory (the learner's turns only) and the
    (row, action) of each turn."""
    game = table.game
    state = game.new_initial_state()
    turns, choices = [], []
    while not state.is_terminal():
        if state.is_chance_node():
            outcomes, chances = zip(*state.chance_outcomes())
            state.apply_action(int(rng.choice(outcomes, p=chances)))
            continue
        seat = state.current_player()
        if opponent == "random" and seat != learner_seat:
            state.apply_action(int(rng.choice(state.legal_actions())))
            continue
        row = table.index[state_key(state, seat)]
        action = int(rng.choice(len(probs[row]), p=probs[row]))
        role = f"player_{seat}"
        turns.append(
            Turn(game.get_type().short_name, seed, seat, role, role, 0, (row,), (action,), (), "", "stop", False, 0)
        )
        choices.append((row, action))
        state.apply_action(action)
    players = (
        ("self", "self") if opponent == "self" else tuple("self" if s == learner_seat else "random" for s in (0, 1))
    )
    result = MatchResult(
        game.get_type().short_name, seed, players, tuple(state.returns()), (0, 0), len(turns), "game_over"
    )
    return Trajectory(result, tuple(turns)), choices


def score(table: Table, eval_games: int, greedy: bool, rng: np.random.Generator) -> float:
    """Exploitability (imperfect-information games), else the non-loss rate against random,
    sampling the table's policy or (`greedy`) playing its most probable move."""
    game = table.game
    probs = table.probs()
    if not perfect_information(game):
        by_state = {key: dict(enumerate(probs[row].tolist())) for key, row in table.index.items()}
        return exploitability_of(game.get_type().short_name, by_state)
    if greedy:
        probs = np.eye(probs.shape[1])[probs.argmax(axis=1)]
    results = [play(table, probs, "random", g % 2, g, rng)[0].result for g in range(eval_games)]
    return statistics.mean(r.rewards[r.players.index("self")] >= 0 for r in results)


def train(game, args, lr: float, kl_coef: float, estimator: str, seed: int) -> list[tuple[int, float]]:
    """The score after every `args.every` steps of training from a fresh table."""
    generator = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    table = (
        Perceptron(game, args.width, generator) if args.policy == "perceptron" else Table(game, args.tilt, generator)
    )
    reference = table.log_probs().detach()
    optimizer = torch.optim.Adam(table.parameters(), lr=lr)
    schedule = LearnerConfig(lr=lr, lr_schedule=args.lr_schedule)
    baselines: dict = {}
    curve = [(0, score(table, args.eval_games, args.greedy, rng))]
    for step in range(1, args.steps + 1):
        played = []
        current = table.log_probs().detach()
        probs = current.exp().numpy()
        for g in range(args.games_per_step):
            opponent = args.opponents[int(rng.integers(len(args.opponents)))]
            played.append(play(table, probs, opponent, g % 2, step * args.games_per_step + g, rng))
        trajectories = [t for t, _ in played]
        advantages, baselines = estimate(
            estimator, trajectories, baselines, turn_discount=args.turn_discount, state_prior=args.state_prior
        )
        rows, actions, weights = [], [], []
        for (_, choices), advantage in zip(played, advantages):
            for (row, action), value in zip(choices, advantage):
                rows.append(row)
                actions.append(action)
                weights.append(value)
        rows, actions, weights = torch.tensor(rows), torch.tensor(actions), torch.tensor(weights)
        before = current[rows, actions]
        for group in optimizer.param_groups:
            group["lr"] = scheduled_lr(schedule, step, args.steps)
        # The learner's PPO-clip loss over `--minibatches` optimizer steps; with one, it is the
        # plain policy gradient (every ratio is 1).
        order = torch.randperm(len(rows), generator=generator)
        for part in range(args.minibatches):
            batch = order[part :: args.minibatches]
            logp = table.log_probs()[rows[batch], actions[batch]]
            ratio = torch.exp(logp - before[batch])
            clipped = ratio.clamp(1 - args.clip, 1 + args.clip)
            loss = -torch.minimum(ratio * weights[batch], clipped * weights[batch]).mean()
            if kl_coef:
                log_ratio = reference[rows[batch], actions[batch]] - logp
                loss = loss + kl_coef * (torch.exp(log_ratio) - log_ratio - 1).mean()
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(table.parameters(), 1.0)
            optimizer.step()
        if args.reference_every and step % args.reference_every == 0:
            reference = table.log_probs().detach()
        if step % args.every == 0:
            curve.append((step, score(table, args.eval_games, args.greedy, rng)))
    return curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("game", choices=["kuhn_poker", "tic_tac_toe"])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--games-per-step", type=int, default=128)
    parser.add_argument("--opponents", nargs="+", choices=["self", "random"], default=["self"])
    parser.add_argument("--lr", type=float, nargs="+", default=[0.01, 0.03])
    parser.add_argument("--lr-schedule", choices=("constant", "linear", "cosine"), default="constant")
    parser.add_argument("--kl", type=float, nargs="+", default=[0.0, 0.2])
    parser.add_argument("--estimator", nargs="+", default=["rae"])
    parser.add_argument("--turn-discount", type=float, default=1.0, help="advantages.turn_discount")
    parser.add_argument("--state-prior", type=float, default=None, help="advantages.state_prior (rae only)")
    parser.add_argument(
        "--reference-every", type=int, default=0, help="steps between moves of the KL reference to the current table"
    )
    parser.add_argument("--tilt", type=float, default=0.0, help="spread of the table's initial random preferences")
    parser.add_argument(
        "--policy", choices=("table", "perceptron"), default="table", help="a table of logits, or a perceptron"
    )
    parser.add_argument("--width", type=int, default=128, help="the perceptron's hidden units per layer")
    parser.add_argument("--minibatches", type=int, default=1, help="learner.minibatches")
    parser.add_argument("--clip", type=float, default=0.2, help="learner.clip")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--eval-games", type=int, default=1000, help="games against random per measurement")
    parser.add_argument("--greedy", action="store_true", help="measure the most probable move in every state")
    args = parser.parse_args()
    game = pyspiel.load_game(args.game)
    metric = "non-loss vs random" if perfect_information(game) else "exploitability"
    if args.greedy:
        metric += " (greedy)"
    print(
        f"{args.game}: {args.steps} steps x {args.games_per_step} games = {args.steps * args.games_per_step} games "
        f"per run against {'/'.join(args.opponents)}; {args.policy} policy; {args.minibatches} minibatches; "
        f"initial tilt {args.tilt}; KL reference moved every "
        f"{args.reference_every or 'never'} steps; turn discount {args.turn_discount}; state prior "
        f"{args.state_prior}; {metric} "
        "(mean over seeds)"
    )
    for estimator, lr, kl_coef in itertools.product(args.estimator, args.lr, args.kl):
        curves = [train(game, args, lr, kl_coef, estimator, seed) for seed in range(args.seeds)]
        by_step = [statistics.mean(c[i][1] for c in curves) for i in range(len(curves[0]))]
        finals = [c[-1][1] for c in curves]
        shown = " ".join(f"{step}:{value:.3f}" for (step, _), value in zip(curves[0], by_step))
        print(
            f"{estimator:6} lr {lr:<6g} kl {kl_coef:<5g} | {shown} | final mean {statistics.mean(finals):.3f} "
            f"min {min(finals):.3f} max {max(finals):.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
