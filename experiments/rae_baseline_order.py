"""The RAE baseline that Kuhn Poker's first move meets, by the move, with a step's games in the
order they finish (as the rollout engine hands them over) and in the order they started.

Self-play of random legal moves through the rollout engine (the tests' `LegalMoveBackend`), so
that only the estimator's bookkeeping differs between the two orders. A baseline that depends on
the move is a bias: a fold ends a game early, so in finish order it would meet a baseline that
the step's longer games have not moved yet.

    python -m experiments.rae_baseline_order [--steps 200] [--games 128] [--state-prior 4]
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np
from transformers import AutoTokenizer

from selfplay.advantages import estimate
from selfplay.default_model import SHIPPED_MODEL
from selfplay.roles.base import advantage_key
from selfplay.rollouts import MatchSpec, RolloutEngine
from tests.fakes import LegalMoveBackend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--games", type=int, default=128)
    parser.add_argument("--state-prior", type=float, default=None)
    parser.add_argument("--burn-in", type=int, default=20, help="steps before the baselines are read")
    args = parser.parse_args()

    engine = RolloutEngine({"p": LegalMoveBackend(AutoTokenizer.from_pretrained(SHIPPED_MODEL), seed=1)})
    met = {order: defaultdict(list) for order in ("finish", "start")}
    baselines: dict[str, dict] = {order: {} for order in met}
    for step in range(args.steps):
        matches = [MatchSpec("kuhn_poker", ("p", "p"), step * args.games + i) for i in range(args.games)]
        finished = list(engine.run(matches))
        for order, batch in (("finish", finished), ("start", sorted(finished, key=lambda t: t.result.seed))):
            advantages, baselines[order] = estimate(
                "rae", batch, baselines[order], key=advantage_key, state_prior=args.state_prior
            )
            if step < args.burn_in:
                continue
            for trajectory, values in zip(batch, advantages):
                first = trajectory.turns[0]
                move = "bet" if "bet" in first.text.lower() else "check"
                met[order][move].append(trajectory.result.rewards[first.seat] - values[0])
    for order, by_move in met.items():
        figures = ", ".join(
            f"{move} {np.mean(v):+.3f} (se {np.std(v) / np.sqrt(len(v)):.3f})" for move, v in sorted(by_move.items())
        )
        print(f"{order} order: baseline met by the first move: {figures}")


if __name__ == "__main__":
    main()
