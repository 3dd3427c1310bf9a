"""Which PSRO configuration should a Kuhn Poker run use? A tabular model of the training
dynamics answers in seconds; it chose attempt 2 of docs/experiments/kuhn-poker-psro.md (issue 63).

A policy is 12 bet probabilities (sigmoids of logits), one per card (Jack, Queen, King) at each
of: the first player's bet at the start, its call after pass-bet, the second player's bet after
a pass, its call after a bet. Values, gradients and exploitability are exact closed forms
(--verify checks them against OpenSpiel). Training is SGD on the exact seat-averaged policy
gradient plus Gaussian noise as large as a sampled estimate's from the step's games, with a
reach-weighted KL-like penalty (0.5) toward a reference reset to the policy every 80 steps, the
learning rate decaying linearly over 480 steps. The meta-game between frozen policies is exact,
solved by `selfplay.evaluation.meta_solvers` as the league solves it. Variants:

- SP: self-play, 512 games a step (its snapshots, every 40 steps, form a population too);
- A: PSRO: the main player, 512 games a step, against the meta-Nash mixture of its snapshots,
  taken every 40 steps;
- B: A with snapshots every 10 steps;
- C: the main player at 256 games a step, snapshots every 20 steps, and a main exploiter at 256
  that restarts from the main player's weights to hunt a snapshot of it taken then, and joins
  the population once it wins 0.9 of a best response's value (checked every 5 steps) or after
  60 steps;
- D: C with OpenSpiel's projected replicator dynamics in place of Nash (about 2 minutes a seed;
  the others take a second);
- E1: C with the exploiter hunting the meta-Nash mixture as it stood at its restart;
- E2: C with half the main player's games in self-play;
- E3: E1 and E2 together.

`--set FIELD=VALUE` changes a `Variant` field in every variant run, for the two levers of issue
74 (docs/experiments/kuhn-poker-magnet.md): the magnet (`reference_every`, `reference_rate`,
`kl`, `kl_schedule`, as `learner.reference_update_every`, `reference_update_rate`, `kl_coef` and
`kl_schedule` set them) and the PSRO oracle (`keep_best`, `games_at_value`, `exploiter_kl`,
`admit`, and `exploiter_noise` for an exploiter that drifts as a language model's did).
`--steps` and `--constant-lr` fit the run's length and schedule to a recipe's. Since the RAE
baseline fix, `--lr 2` matches the built-in model's self-play (0.045-0.057 here; 0.038-0.072
in the LLM runs).

Prints per variant and seed the exploitability of the final meta-strategy's mixture and of the
main player, the members, those weighted over 0.001 (support), each exploiter's steps (">60":
frozen at the cap, short of 0.9 of a best response; "x": not admitted) and how many ended at
or below 0 against their target; then the means over seeds.

    python experiments/kuhn_psro_tabular.py --variants SP,A,B,C,D,E1,E2,E3 --lr 1.5 [--noise 1] [--seeds 3]
    python experiments/kuhn_psro_tabular.py --variants SP --lr 2 --seeds 5 --set reference_every=160 kl=0.25
    python experiments/kuhn_psro_tabular.py --verify
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from dataclasses import dataclass

import numpy as np

from selfplay.evaluation.meta_solvers import solve

CARDS = np.arange(3)
SHOWDOWN = np.sign(CARDS[:, None] - CARDS[None, :]).astype(float)  # +1 where the first player's card is higher
DEAL = (SHOWDOWN != 0).astype(float) / 6.0  # probability of each (first card, second card)
RETURN_VARIANCE = 1.5  # about E[(return - baseline)^2] of one game: the scale of the gradient noise
_START_BETS = np.array([0.1, 0.2, 0.4] * 4)  # passive, reading its card a little: exploitability 0.493
START_LOGITS = np.log(_START_BETS / (1 - _START_BETS))
STEPS, REFERENCE_EVERY, KL_COEF = 480, 80, 0.5
EXPLOITER_LR_FACTOR, EXPLOITER_CHECK_EVERY, EXPLOITER_TARGET, EXPLOITER_CAP = 3, 5, 0.9, 60
GAMES_SCALE_MAX = 8


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-logits))


def first_seat(policy):
    """Bet at the start and call after pass-bet, a column per card of the first player."""
    return policy[0:3, None], policy[3:6, None]


def second_seat(policy):
    """Bet after a pass and call after a bet, a row per card of the second player."""
    return policy[None, 6:9], policy[None, 9:12]


def first_seat_value(first, second) -> float:
    """What the first player expects to win, `first` in the first seat against `second`."""
    bet, call = first_seat(first)
    bet_after_pass, call_bet = second_seat(second)
    value = bet * (call_bet * 2 * SHOWDOWN + (1 - call_bet)) + (1 - bet) * (
        (1 - bet_after_pass) * SHOWDOWN + bet_after_pass * (call * 2 * SHOWDOWN - (1 - call))
    )
    return (value * DEAL).sum()


def seat_averaged_value(policy, opponent) -> float:
    """What `policy` expects to win against `opponent`, half its games in each seat."""
    return 0.5 * (first_seat_value(policy, opponent) - first_seat_value(opponent, policy))


def value_gradient(policy, opponent) -> np.ndarray:
    """The exact gradient of seat_averaged_value with respect to `policy`'s 12 probabilities."""
    bet, call = first_seat(policy)
    bet_after_pass, call_bet = second_seat(opponent)
    d_bet = (
        (call_bet * 2 * SHOWDOWN + (1 - call_bet))
        - ((1 - bet_after_pass) * SHOWDOWN + bet_after_pass * (call * 2 * SHOWDOWN - (1 - call)))
    ) * DEAL
    d_call = ((1 - bet) * bet_after_pass * (2 * SHOWDOWN + 1)) * DEAL
    opponent_bet, opponent_call = first_seat(opponent)
    d_bet_after_pass = ((1 - opponent_bet) * (-SHOWDOWN + opponent_call * 2 * SHOWDOWN - (1 - opponent_call))) * DEAL
    d_call_bet = (opponent_bet * (2 * SHOWDOWN - 1)) * DEAL
    halves = (0.5 * d_bet.sum(1), 0.5 * d_call.sum(1), -0.5 * d_bet_after_pass.sum(0), -0.5 * d_call_bet.sum(0))
    return np.concatenate(halves)


def reach(policy, opponent) -> np.ndarray:
    """The probability that a game in `policy`'s seat reaches each of its 12 information states."""
    other_card = DEAL * 6 / 2  # the opponent's card, given one's own
    first_after_pass_bet = (1 - policy[0:3]) * (other_card @ opponent[6:9]) / 3
    second_after_pass = (other_card @ (1 - opponent[0:3])) / 3
    second_after_bet = (other_card @ opponent[0:3]) / 3
    return np.concatenate([np.full(3, 1 / 3), first_after_pass_bet, second_after_pass, second_after_bet])


def exploitability(policy) -> float:
    """The mean of what a best response wins against `policy` in each seat."""
    bet, call = first_seat(policy)
    bet_after_pass, call_bet = second_seat(policy)
    # In the first seat, per card: bet, or pass and then call or fold if bet into.
    if_bet = (DEAL * (call_bet * 2 * SHOWDOWN + 1 - call_bet)).sum(1)
    if_pass = (DEAL * (1 - bet_after_pass) * SHOWDOWN).sum(1)
    bet_into = DEAL * bet_after_pass
    if_bet_into = np.maximum((bet_into * 2 * SHOWDOWN).sum(1), (bet_into * -1).sum(1))
    first = np.maximum(if_bet, if_pass + if_bet_into).sum()
    # In the second seat, per card: after a pass, pass or bet; after a bet, fold or call.
    passed, opened = DEAL * (1 - bet), DEAL * bet
    after_pass = np.maximum((passed * -SHOWDOWN).sum(0), (passed * (-2 * call * SHOWDOWN + (1 - call))).sum(0))
    after_bet = np.maximum((opened * -1).sum(0), (opened * -2 * SHOWDOWN).sum(0))
    return 0.5 * (first + (after_pass + after_bet).sum())


def behavioural_mixture(policies, weights) -> np.ndarray:
    """The one policy that plays as the mixture does: each member's call after pass-bet weighted
    by how often it passes."""
    policies, weights = np.asarray(policies), np.asarray(weights)[:, None]
    bet = (weights * policies[:, 0:3]).sum(0)
    passed = (weights * (1 - policies[:, 0:3])).sum(0)
    call = (weights * (1 - policies[:, 0:3]) * policies[:, 3:6]).sum(0) / np.maximum(passed, 1e-12)
    return np.concatenate([bet, call, (weights * policies[:, 6:12]).sum(0)])


def noisy_gradient(logits, opponent, games, variance, rng, reference=None, kl=KL_COEF) -> np.ndarray:
    """The gradient in logits of the value against `opponent`, with the noise of an estimate from
    `games` games (half in each seat) whose returns have `variance`, less the KL-like pull of
    strength `kl` toward `reference` if given."""
    policy = sigmoid(logits)
    slope, visits = policy * (1 - policy), reach(policy, opponent)
    gradient = value_gradient(policy, opponent) * slope
    # In a seat's games, a state's term (return - baseline) * (action - p) has variance about
    # reach * p(1 - p) * variance a game; the two seats' estimates are averaged.
    gradient += 0.5 * np.sqrt(visits * slope * variance / (games / 2)) * rng.standard_normal(12)
    if reference is not None:
        gradient -= kl * 0.5 * visits * slope * (logits - reference)
    return gradient


@dataclass(frozen=True)
class Variant:
    games: int  # per step for each learning player (an exploiter halves the main player's)
    snapshot_every: int
    exploiter: str | None = None  # None, "snapshot" (hunt the main player) or "meta" (the mixture)
    solver: str = "nash"
    self_play: float = 0.0  # the main player's share of games against itself
    # The magnet: the main player's KL reference, moved `reference_rate` of the way to the policy
    # every `reference_every` steps (1: R-NaD's reset; small, every step: MMD's moving magnet,
    # an exponential average), its pull `kl` constant or decaying linearly to 0 over the run.
    reference_every: int = REFERENCE_EVERY
    reference_rate: float = 1.0
    kl: float = KL_COEF
    kl_schedule: str = "constant"
    # The oracle: freeze an exploiter's best checked logits rather than its last; play
    # (games_at_value / v)^2 times its games (at most GAMES_SCALE_MAX) against a target a best
    # response beats by v; pull it with `exploiter_kl` toward its logits at restart; admit it to the
    # population only if it beats the mixture of the moment ("beats"), or always.
    keep_best: bool = False
    games_at_value: float | None = None
    exploiter_kl: float = 0.0
    admit: str = "always"
    # The variance of the exploiter's gradient noise, times that of the main player's: above 1 it
    # drifts as a language model's did (kuhn-poker-psro.md: half its exploiters near equilibrium
    # ended at or below 0 against their target), which exact gradients plus noise do not.
    exploiter_noise: float = 1.0


VARIANTS = {
    "SP": Variant(512, 40, self_play=1.0),
    "A": Variant(512, 40),
    "B": Variant(512, 10),
    "C": Variant(256, 20, "snapshot"),
    "D": Variant(256, 20, "snapshot", solver="prd"),
    "E1": Variant(256, 20, "meta"),
    "E2": Variant(256, 20, "snapshot", self_play=0.5),
    "E3": Variant(256, 20, "meta", self_play=0.5),
}


class Population:
    """Frozen policies, their exact meta-game and its meta-strategy (solved when next asked)."""

    def __init__(self, solver: str):
        self.solver, self.members, self.payoff, self._weights = solver, [], np.zeros((0, 0)), None

    def add(self, policy) -> None:
        against = np.array([seat_averaged_value(member, policy) for member in self.members])
        self.payoff = np.block([[self.payoff, against[:, None]], [-against[None, :], np.zeros((1, 1))]])
        self.members.append(policy.copy())
        self._weights = None

    def weights(self) -> np.ndarray:
        if self._weights is None:
            self._weights = solve(self.solver, self.payoff)
        return self._weights

    def mixture(self) -> np.ndarray:
        return behavioural_mixture(self.members, self.weights())


def train(variant: Variant, seed: int, lr: float, noise: float, steps: int = STEPS, decay: bool = True) -> dict:
    """One run of `variant` from the passive start; what its population and main player end at.
    A run plays as many games as `steps` steps at the variant's games a step, however many steps
    that takes (an exploiter playing more games ends it sooner); the learning rate (if `decay`)
    and an annealed KL fall linearly with the games played."""
    rng, variance = np.random.default_rng(seed), RETURN_VARIANCE * noise
    share, games = variant.self_play, variant.games
    budget = steps * games * (2 if variant.exploiter else 1)
    main, population, exploiter_steps, exploiter_values = START_LOGITS.copy(), Population(variant.solver), [], []
    population.add(sigmoid(main))
    reference = main.copy()

    def restart_exploiter():
        """From the main player's weights, against the meta-strategy's mixture or a new snapshot."""
        target = population.mixture() if variant.exploiter == "meta" else sigmoid(main)
        if variant.exploiter == "snapshot":
            population.add(target)
        return main.copy(), target, 0

    def exploiter_games(target) -> int:
        if variant.games_at_value is None:
            return games
        scale = (variant.games_at_value / max(exploitability(target), 1e-9)) ** 2
        return int(games * min(max(scale, 1.0), GAMES_SCALE_MAX))

    def freeze(policy, trained, hit) -> None:
        admitted = variant.admit == "always" or seat_averaged_value(policy, population.mixture()) > 0
        exploiter_steps.append(("" if hit else ">") + str(trained) + ("" if admitted else "x"))
        exploiter_values.append(seat_averaged_value(policy, target) / exploitability(target))
        if admitted:
            population.add(policy)

    if variant.exploiter:
        exploiter, target, trained = restart_exploiter()
        start, best, best_value = exploiter.copy(), exploiter.copy(), -np.inf
    played, step = 0, 0
    while played < budget:
        done = played / budget
        step_lr = lr * (1 - done if decay else 1)
        kl = variant.kl * (1 - done if variant.kl_schedule == "linear" else 1)
        if step and step % variant.reference_every == 0:
            reference = reference + variant.reference_rate * (main - reference)
        gradient = 0
        if share > 0:
            gradient = share * noisy_gradient(main, sigmoid(main), games * share, variance, rng, reference, kl)
        if share < 1:
            against = population.mixture()
            gradient += (1 - share) * noisy_gradient(main, against, games * (1 - share), variance, rng, reference, kl)
        main = main + step_lr * gradient
        played += games
        if variant.exploiter:
            pulled = (start, variant.exploiter_kl) if variant.exploiter_kl else (None,)
            hunting = exploiter_games(target)
            exploiter = exploiter + EXPLOITER_LR_FACTOR * lr * noisy_gradient(
                exploiter, target, hunting, variance * variant.exploiter_noise, rng, *pulled
            )
            played += hunting
            trained += 1
            if trained % EXPLOITER_CHECK_EVERY == 0:
                value = seat_averaged_value(sigmoid(exploiter), target)
                if value > best_value:
                    best, best_value = exploiter.copy(), value
                hit = value >= EXPLOITER_TARGET * exploitability(target)
                if hit or trained >= EXPLOITER_CAP:
                    freeze(sigmoid(best if variant.keep_best else exploiter), trained, hit)
                    exploiter, target, trained = restart_exploiter()
                    start, best, best_value = exploiter.copy(), exploiter.copy(), -np.inf
        step += 1
        if step % variant.snapshot_every == 0:
            population.add(sigmoid(main))
    return dict(
        mixture=exploitability(population.mixture()),
        main=exploitability(sigmoid(main)),
        members=len(population.members),
        support=int((population.weights() > 1e-3).sum()),
        exploiter_steps=exploiter_steps,
        exploiter_values=exploiter_values,
        steps=step,
    )


def verify() -> None:
    """The closed forms against OpenSpiel and finite differences, on random policies."""
    import pyspiel
    from open_spiel.python import policy as openspiel_policy
    from open_spiel.python.algorithms import expected_game_score
    from open_spiel.python.algorithms import exploitability as openspiel_exploitability

    game, rng, nudges = pyspiel.load_game("kuhn_poker"), np.random.default_rng(0), 1e-6 * np.eye(12)

    def tabular(policy):
        table = openspiel_policy.TabularPolicy(game)
        for state, row in table.state_lookup.items():  # "2pb": a King after pass-bet
            bet = policy[{"": 0, "pb": 3, "p": 6, "b": 9}[state[1:]] + int(state[0])]
            table.action_probability_array[row] = [1 - bet, bet]
        return table

    for _ in range(3):
        policy, opponent = rng.uniform(size=12), rng.uniform(size=12)
        nash_conv = openspiel_exploitability.nash_conv(game, tabular(policy))
        value = expected_game_score.policy_value(game.new_initial_state(), [tabular(policy), tabular(opponent)])[0]
        rise = [seat_averaged_value(policy + h, opponent) - seat_averaged_value(policy - h, opponent) for h in nudges]
        gradient_error = np.abs(value_gradient(policy, opponent) - np.array(rise) / 2e-6).max()
        print(
            f"exploitability {exploitability(policy):.6f} (OpenSpiel {nash_conv / 2:.6f})  value "
            f"{first_seat_value(policy, opponent):.6f} (OpenSpiel {value:.6f})  gradient error {gradient_error:.1e}"
        )
    # Mixing by reach must play as the mixture does (in the second seat, mixing is plainly linear).
    members, weights = rng.uniform(size=(4, 12)), rng.dirichlet(np.ones(4))
    mixed = sum(w * first_seat_value(member, opponent) for w, member in zip(weights, members))
    behavioural = first_seat_value(behavioural_mixture(members, weights), opponent)
    print(f"behavioural mixture error {abs(behavioural - mixed):.1e}")
    start, uniform = exploitability(sigmoid(START_LOGITS)), exploitability(np.full(12, 0.5))
    print(f"exploitability at the start {start:.3f}, of uniform play {uniform:.3f}")


def _parsed(value: str, annotation: str):
    """A --set value as its Variant field's type ("none" for an optional one's None)."""
    if value.lower() == "none":
        return None
    if annotation.startswith("bool"):
        return value.lower() in ("1", "true", "yes")
    for kind in (int, float):
        if annotation.startswith(kind.__name__) or annotation.startswith(f"{kind.__name__} |"):
            return kind(value)
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default="SP,A,B,C,D,E1,E2,E3", help="comma-separated: " + ",".join(VARIANTS))
    parser.add_argument("--lr", type=float, default=1.5, help="initial learning rate (the exploiter's is 3 times it)")
    parser.add_argument("--noise", type=float, default=1.0, help="multiplier on the variance of a game's return")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=STEPS, help="steps of the variant's games a run plays")
    parser.add_argument("--constant-lr", action="store_true", help="no decay of the learning rate")
    parser.add_argument(
        "--set", nargs="+", default=[], metavar="FIELD=VALUE", help="override a Variant field in every variant"
    )
    parser.add_argument("--verify", action="store_true", help="check the closed forms against OpenSpiel and exit")
    args = parser.parse_args()
    if args.verify:
        return verify()
    fields = {field.name: field.type for field in dataclasses.fields(Variant)}
    overrides = {key: _parsed(value, fields[key]) for key, value in (item.split("=", 1) for item in args.set)}
    rows = []
    for name in args.variants.split(","):
        results = []
        variant = dataclasses.replace(VARIANTS[name], **overrides)
        for seed in range(args.seeds):
            results.append(r := train(variant, seed, args.lr, args.noise, args.steps, not args.constant_lr))
            print(
                f"{name} seed {seed}: mixture {r['mixture']:.3f}  main {r['main']:.3f}  members {r['members']}  "
                f"support {r['support']}  exploiter steps {' '.join(r['exploiter_steps']) or '-'}  "
                f"exploiters at or below 0 against their target: "
                f"{sum(v <= 0 for v in r['exploiter_values'])} of {len(r['exploiter_values'])}",
                flush=True,
            )
        rows.append((name, *(statistics.mean(r[key] for r in results) for key in ("mixture", "main", "support"))))
    print(f"\nmeans over {args.seeds} seeds, lr {args.lr:g}, noise {args.noise:g}")
    print("| variant | mixture | main | support |\n|---|---|---|---|")
    for name, mixture, main_player, support in rows:
        print(f"| {name} | {mixture:.3f} | {main_player:.3f} | {support:.1f} |")


if __name__ == "__main__":
    main()
