"""How low can self-play training drive Kuhn Poker exploitability for a given number of games,
when the policy reads its card perfectly?

The policy here is tabular: one pair of logits per information state, so it tells every state
apart and nothing it learns in one state disturbs another. It is trained the way `selfplay
train` trains a language model: each step plays `--games-per-step` games of self-play, turns
become `Trajectory` records, advantages come from selfplay's own estimator
(`selfplay.advantages.estimate`), and the loss is the on-policy policy gradient with the
learner's token-mean aggregation, optional KL penalty to the initial policy (the learner's k3
estimate), gradient clipping at 1 and Adam. Exploitability is exact (OpenSpiel).

A language-model policy pays for the same games with far more compute and must also learn to
read its card, so these figures bound what `benchmarks/train_targets.py` can show in Kuhn Poker
at the same number of games.

    python benchmarks/kuhn_ceiling.py --steps 300 --games-per-step 128 --lr 0.01 0.03 --kl 0 0.1 --seeds 3
"""

from __future__ import annotations

import argparse
import itertools
import statistics

import numpy as np
import pyspiel
import torch
from open_spiel.python import policy as openspiel_policy
from open_spiel.python.algorithms.exploitability import exploitability

from selfplay.advantages import estimate
from selfplay.records import MatchResult, Trajectory, Turn

GAME = pyspiel.load_game("kuhn_poker")


def exploitability_of(logits: torch.Tensor, index: dict[str, int]) -> float:
    table = openspiel_policy.TabularPolicy(GAME)
    probs = torch.softmax(logits.detach(), dim=-1).numpy()
    for state, row in table.state_lookup.items():
        table.action_probability_array[row] = probs[index[state]]
    return exploitability(GAME, table)


def play(logits: torch.Tensor, index: dict[str, int], seed: int, rng: np.random.Generator):
    """One game of self-play: its Trajectory and the (information state, action) of each turn."""
    state = GAME.new_initial_state()
    turns, choices = [], []
    probs = torch.softmax(logits.detach(), dim=-1).numpy()
    while not state.is_terminal():
        if state.is_chance_node():
            outcomes, chances = zip(*state.chance_outcomes())
            state.apply_action(int(rng.choice(outcomes, p=chances)))
            continue
        seat = state.current_player()
        row = index[state.information_state_string(seat)]
        action = int(rng.choice(2, p=probs[row]))
        role = f"player_{seat}"
        turns.append(Turn("kuhn_poker", seed, seat, role, role, 0, (), (action,), (), "", "stop", False, 0.0))
        choices.append((row, action))
        state.apply_action(action)
    result = MatchResult("kuhn_poker", seed, ("self", "self"), tuple(state.returns()), (0, 0), len(turns), "game_over")
    return Trajectory(result, tuple(turns)), choices


def train(
    steps: int, games_per_step: int, lr: float, kl_coef: float, estimator: str, seed: int, every: int, tilt: float
):
    """Exploitability after every `every` steps of tabular self-play. The initial policy, which
    the KL penalty pulls towards, is uniform, or with `tilt` > 0 a softmax of `tilt` times
    standard normal draws in each state, as the warm-started default model's is."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    index = {s: i for i, s in enumerate(openspiel_policy.TabularPolicy(GAME).state_lookup)}
    logits = (tilt * torch.randn(len(index), 2)).requires_grad_()
    reference = torch.log_softmax(logits.detach(), dim=-1)
    optimizer = torch.optim.Adam([logits], lr=lr)
    baselines: dict = {}
    curve = []
    for step in range(1, steps + 1):
        played = [play(logits, index, step * games_per_step + g, rng) for g in range(games_per_step)]
        advantages, baselines = estimate(estimator, [t for t, _ in played], baselines)
        rows, actions, weights = [], [], []
        for (_, choices), advantage in zip(played, advantages):
            for (row, action), a in zip(choices, advantage):
                rows.append(row)
                actions.append(action)
                weights.append(a)
        logp_all = torch.log_softmax(logits, dim=-1)[rows]
        logp = logp_all[range(len(rows)), actions]
        loss = -(torch.tensor(weights) * logp).mean()
        if kl_coef:
            log_ratio = reference[rows, actions] - logp
            loss = loss + kl_coef * (torch.exp(log_ratio) - log_ratio - 1).mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([logits], 1.0)
        optimizer.step()
        if step % every == 0:
            curve.append((step, exploitability_of(logits, index)))
    return curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--games-per-step", type=int, default=128)
    parser.add_argument("--lr", type=float, nargs="+", default=[0.01, 0.03])
    parser.add_argument("--kl", type=float, nargs="+", default=[0.0, 0.1])
    parser.add_argument("--estimator", nargs="+", default=["rae"])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--tilt", type=float, default=0.0, help="spread of the initial policy's random preferences")
    args = parser.parse_args()
    games = args.steps * args.games_per_step
    print(f"{args.steps} steps x {args.games_per_step} games = {games} games per run; initial tilt {args.tilt}")
    print("estimator  lr      kl    | exploitability by step (mean over seeds)       | final: mean  min   max")
    for estimator, lr, kl_coef in itertools.product(args.estimator, args.lr, args.kl):
        curves = [
            train(args.steps, args.games_per_step, lr, kl_coef, estimator, s, args.every, args.tilt)
            for s in range(args.seeds)
        ]
        by_step = [statistics.mean(c[i][1] for c in curves) for i in range(len(curves[0]))]
        finals = [c[-1][1] for c in curves]
        shown = " ".join(f"{step}:{value:.3f}" for (step, _), value in zip(curves[0], by_step))
        print(
            f"{estimator:10} {lr:<7g} {kl_coef:<5g} | {shown} | "
            f"{statistics.mean(finals):.3f} {min(finals):.3f} {max(finals):.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
