"""What a Kuhn Poker (or, with --game, Leduc Hold'em) league or PSRO run buys over pure self-play,
by games played, all exact (OpenSpiel):

- each self-play run: the exploitability of its latest policy at each evaluation (its eval.jsonl);
- each league run (configs/kuhn_league.yaml, PFSP with exploiters, or configs/kuhn_psro.yaml,
  the main player against the population's meta-strategy), at each step where the main player
  was frozen into a snapshot: the exploitability of the main player; of the mixture of the
  meta-game over every snapshot taken so far, solved from their exact payoffs by the run's
  meta-solver (its psro:SOLVER rule; Nash for a PFSP league, as `selfplay league show --meta
  kuhn_poker` solves it); of that mixture over the main player's snapshots alone; for a PSRO
  run, of the meta-strategy it trained against next, solved from its own empirical payoffs
  (from exact ones under league.psro_payoffs=exact: then the mixture itself); and in Kuhn Poker
  the main player's probability of betting a King after a check, where the equilibrium always
  bets;
- what each exploiter found when it was frozen: its expected value against its target beside a
  best response's, as the run logged them (RUN_DIR/exploiters.jsonl under the exact stopping
  rule), else computed here from the snapshots against the target the log names, or, for a run
  without the log, the main player's latest snapshot by then; and against the mixture of the
  population before it, beside a best response's.

Games played count every learning player's games and, in a PSRO run, the evaluation games
between snapshots. The recipes retire no snapshot but the exploiters `league.exploiter_admit`
turns away, retired as they are taken, so the population at a step is every snapshot taken by
then and still active.

    python experiments/kuhn_league.py --league runs/kuhn_league_s0 ... --self-play runs/kuhn_sp_s0 ... \
        [--out DIR] [--game leduc_holdem]

Prints one table per league run and a final comparison, the runs paired by seed in the order
given; writes `league_curves.png` (and `league_curves.json`) into each league run directory
and, with --out, one plot of every run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from transformers.utils import logging as transformers_logging  # noqa: E402

from selfplay.config import TrainConfig, load_config  # noqa: E402
from selfplay.evaluation.evaluate import find_candidates  # noqa: E402
from selfplay.evaluation.exploitability import exploitability_of, move_probabilities  # noqa: E402
from selfplay.evaluation.meta_solvers import solve  # noqa: E402
from selfplay.evaluation.meta_strategy import expected_payoffs, mixture_probabilities  # noqa: E402
from selfplay.evaluation.training_curve import read_evaluations  # noqa: E402
from selfplay.league.exploiter_log import read_stops  # noqa: E402
from selfplay.league.matchmaking import MAIN, is_psro, psro_solver  # noqa: E402
from selfplay.league.meta_game import solve_meta_game  # noqa: E402
from selfplay.league.payoff import PayoffTable  # noqa: E402
from selfplay.league.records import LEARNING_KINDS  # noqa: E402
from selfplay.league.standings import open_league  # noqa: E402
from selfplay.rollouts import RolloutSettings  # noqa: E402
from selfplay.run_dir import RunDir  # noqa: E402

KUHN = "kuhn_poker"
KING_AFTER_CHECK = "2p"  # the second player's information state holding a King after a check
BET = 1  # OpenSpiel's Kuhn Poker actions: 0 pass, 1 bet


def saved_config(run_dir: Path) -> TrainConfig:
    return load_config(str(RunDir(run_dir).saved_config()), [])


def games_per_step(config: TrainConfig) -> int:
    """Games the whole run plays in one step: every learning player's."""
    learners = 1 + (config.league.main_exploiters + config.league.league_exploiters if config.league.enabled else 0)
    return learners * config.rollout.games_per_step


def psro_solvers(config: TrainConfig) -> list[str]:
    """The meta-solvers the main player's psro rules name (none for a PFSP league or self-play)."""
    return [psro_solver(rule) for rule, weight in config.opponents.items() if weight > 0 and is_psro(rule)]


def self_play_curve(run_dir: Path, game: str) -> list[tuple[int, float]]:
    """(games played, exploitability of the latest policy) at each of the run's evaluations."""
    per_step = games_per_step(saved_config(run_dir))
    return [
        (e.step * per_step, e.figures[f"eval/{game}/exploitability"])
        for e in read_evaluations(RunDir(run_dir).eval_log)
    ]


def league_curve(run_dir: Path, game: str) -> tuple[list[dict], list[dict]]:
    """Rows for each step where the main player was frozen, and for each exploiter snapshot
    (see the module's docstring)."""
    config = saved_config(run_dir)
    asked = RolloutSettings.from_config(config.rollout)
    per_step = games_per_step(config)
    solvers = psro_solvers(config)
    solver = solvers[0] if solvers else "nash"
    with open_league(run_dir) as store:
        players = store.players()
        matches = store.matches()
    learners = {p.name for p in players if p.kind in LEARNING_KINDS}
    # Store order, oldest first: the order in which the league admits past players to its meta-game.
    snapshots = [p for p in players if p.kind == "snapshot"]
    policies = {}
    for snapshot in snapshots:
        (candidate,) = find_candidates([str(run_dir / snapshot.weights)])
        model, tokenizer = candidate.network()
        policies[snapshot.name] = move_probabilities(model, tokenizer, game, asked)

    # Every pair's exact payoff, once: each mixture below solves a corner of it.
    names = [s.name for s in snapshots]
    payoffs = expected_payoffs(game, [policies[name] for name in names])

    def population(step: int, mains_only: bool = False) -> list[str]:
        return [
            s.name for s in snapshots if s.active and s.created_step <= step and (s.parent == MAIN or not mains_only)
        ]

    def mixture_at(step: int, mains_only: bool = False) -> tuple[dict, float]:
        """The run's meta-solver's mixture over every snapshot taken by `step` (or the main
        player's only), from their exact payoffs, and its exploitability."""
        members = population(step, mains_only)
        rows = [names.index(name) for name in members]
        weights = solve(solver, payoffs[np.ix_(rows, rows)])
        mixture = mixture_probabilities(game, [policies[n] for n in members], weights)
        return mixture, exploitability_of(game, mixture)

    def trained_against(step: int) -> float | None:
        """For a PSRO run, the exploitability of the meta-strategy the main player met after
        `step`: the run's meta-solver on its empirical payoffs through `step`."""
        if not solvers:
            return None
        if config.league.psro_payoffs == "exact":
            return mixture_at(step)[1]
        names = population(step)
        table = PayoffTable()
        table.extend(m for m in matches if m.step <= step)
        means, _, games = table.return_matrix(names, game)
        weights = solve_meta_game(solver, means, games, config.league.psro_min_games)
        return exploitability_of(game, mixture_probabilities(game, [policies[n] for n in names], weights))

    def games_by(step: int) -> int:
        """Games played through `step`: the learning players' and the evaluation games."""
        evaluation = sum(1 for m in matches if m.step <= step and not learners & set(m.players))
        return step * per_step + evaluation

    mains = [s for s in snapshots if s.parent == MAIN]
    rows = []
    for main in mains:
        mixture, mixture_exploitability = mixture_at(main.created_step)
        rows.append(
            {
                "step": main.created_step,
                "games": games_by(main.created_step),
                "snapshots": len(population(main.created_step)),
                "main": exploitability_of(game, policies[main.name]),
                "mixture": mixture_exploitability,
                "main_mixture": mixture_at(main.created_step, mains_only=True)[1],
                "trained_against": trained_against(main.created_step),
                "main_king_bets_after_check": policies[main.name][KING_AFTER_CHECK][BET] if game == KUHN else None,
                "mixture_king_bets_after_check": mixture[KING_AFTER_CHECK][BET] if game == KUHN else None,
            }
        )
    logged = {record["snapshot"]: record for record in read_stops(RunDir(run_dir).exploiter_log)}
    found = []
    for exploiter in (s for s in snapshots if s.parent != MAIN):
        step = exploiter.created_step
        record = logged.get(exploiter.name, {})
        target = record.get("target") or {[m for m in mains if m.created_step <= step][-1].name: 1.0}
        target_policy = mixture_probabilities(game, [policies[n] for n in target], list(target.values()))
        mixture, mixture_exploitability = mixture_at(step - 1)  # the population before it
        values = expected_payoffs(game, [policies[exploiter.name], target_policy, mixture])
        logged_values = record.get("value") is not None
        found.append(
            {
                "exploiter": exploiter.name,
                "step": step,
                "reason": record.get("reason"),
                "target": ", ".join(f"{name} {weight:.2f}" for name, weight in target.items()),
                "vs_target": record["value"] if logged_values else values[0, 1],
                "best_vs_target": record["best_response_value"]
                if logged_values
                else exploitability_of(game, target_policy),
                "vs_mixture": values[0, 2],
                "best_vs_mixture": mixture_exploitability,
            }
        )
    return rows, found


def figure(value: float | None, spec: str = ".4f") -> str:
    return "-" if value is None else format(value, spec)


def print_league(run_dir: Path, rows: list[dict], found: list[dict]) -> None:
    print(f"\n{run_dir}: exploitability (exact) where the main player was frozen")
    print(
        "step | games | snapshots | main | mixture | mixture of main's | meta-strategy trained against | "
        "K bets after a check: main | mixture"
    )
    for r in rows:
        print(
            f"{r['step']} | {r['games']} | {r['snapshots']} | {r['main']:.4f} | {r['mixture']:.4f} | "
            f"{r['main_mixture']:.4f} | {figure(r['trained_against'])} | "
            f"{figure(r['main_king_bets_after_check'], '.2f')} | {figure(r['mixture_king_bets_after_check'], '.2f')}"
        )
    if found:
        print("\nwhat each exploiter won when frozen, beside a best response's winnings (exact, per hand)")
        print("exploiter | frozen by | target | won | best | against the mixture before it: won | best")
        for f in found:
            print(
                f"{f['exploiter']} | {f['reason'] or '-'} | {f['target']} | {f['vs_target']:+.4f} | "
                f"{f['best_vs_target']:.4f} | {f['vs_mixture']:+.4f} | {f['best_vs_mixture']:.4f}"
            )


def print_final(self_play: dict[str, list], leagues: dict[str, tuple[list[dict], list[dict]]]) -> None:
    """One line per seed: the runs paired in the order given."""
    print("\nfinal exploitability (exact), runs paired by seed in the order given")
    print(
        "seed | self-play, latest | league main | league mixture | meta-strategy trained against | games | "
        "exploiters: won of best"
    )
    curves = list(self_play.values())
    for index, (rows, found) in enumerate(leagues.values()):
        last = rows[-1]
        latest = curves[index][-1][1] if index < len(curves) else None
        exploiters = ", ".join(f"{f['exploiter']} {f['vs_target']:+.3f} of {f['best_vs_target']:.3f}" for f in found)
        print(
            f"{index} | {figure(latest)} | {last['main']:.4f} | {last['mixture']:.4f} | "
            f"{figure(last['trained_against'])} | {last['games']} | {exploiters or '-'}"
        )
    for name, curve in self_play.items():
        print(f"self-play {name}: latest {curve[-1][1]:.4f} after {curve[-1][0]} games")


def plot(ax, self_play: dict[str, list], leagues: dict[str, list[dict]], game: str) -> None:
    for name, curve in self_play.items():
        ax.plot(*zip(*curve), color="tab:blue", alpha=0.7, label=f"self-play, latest ({name})")
    for name, rows in leagues.items():
        games = [r["games"] for r in rows]
        ax.plot(games, [r["main"] for r in rows], color="tab:orange", alpha=0.7, label=f"league, main ({name})")
        ax.plot(games, [r["mixture"] for r in rows], color="tab:green", alpha=0.9, label=f"league, mixture ({name})")
        # Under exact payoffs the meta-strategy met is the mixture: one line for both.
        if any(r["trained_against"] not in (None, r["mixture"]) for r in rows):
            trained = [r["trained_against"] for r in rows]
            ax.plot(games, trained, color="tab:purple", alpha=0.9, label=f"PSRO, meta-strategy met ({name})")
    if game == KUHN:
        ax.axhline(0.05, color="grey", linestyle=":", linewidth=1)  # the goal of issue 63
    ax.set_xlabel("games played (all learning players, and PSRO's evaluation games)")
    ax.set_ylabel("exploitability (exact)")
    ax.legend(fontsize=6)


def save_plot(path: Path, self_play: dict[str, list], leagues: dict[str, list[dict]], game: str) -> None:
    figure, ax = plt.subplots(figsize=(8, 5))
    plot(ax, self_play, leagues, game)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--league", nargs="*", default=[], type=Path, help="league run directories")
    parser.add_argument("--self-play", nargs="*", default=[], type=Path, help="self-play run directories")
    parser.add_argument("--out", type=Path, help="a directory for the plot of every run")
    parser.add_argument("--game", default=KUHN, help="the game the runs trained (default: kuhn_poker)")
    args = parser.parse_args()
    transformers_logging.disable_progress_bar()  # a "Loading weights" bar for every snapshot
    self_play = {str(run): self_play_curve(run, args.game) for run in args.self_play}
    leagues = {}
    for run in args.league:
        rows, found = league_curve(run, args.game)
        leagues[str(run)] = rows, found
        print_league(run, rows, found)
        (run / "league_curves.json").write_text(json.dumps({"main": rows, "exploiters": found}, indent=1))
        save_plot(run / "league_curves.png", self_play, {str(run): rows}, args.game)
    print_final(self_play, leagues)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        curves = {name: rows for name, (rows, _) in leagues.items()}
        save_plot(args.out / "league_curves.png", self_play, curves, args.game)


if __name__ == "__main__":
    main()
