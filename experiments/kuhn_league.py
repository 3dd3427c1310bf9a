"""What a Kuhn Poker league buys over pure self-play, by games played, all exact (OpenSpiel):

- each self-play run: the exploitability of its latest policy at each evaluation (its eval.jsonl);
- each league run, at each step where the main player was frozen into a snapshot: the
  exploitability of the main player, of the Nash mixture of the meta-game over every snapshot
  taken so far (as `selfplay league show --meta kuhn_poker` solves it), and of the Nash
  mixture over the main player's snapshots alone; what each
  exploiter found when it was frozen: its expected value against the main player of that step
  beside the best response's (the main player's exploitability), and against the mixture beside
  the mixture's; and the main player's probability of betting a King after a check, where the
  equilibrium always bets.

    python experiments/kuhn_league.py --league runs/kuhn_league_s0 ... --self-play runs/kuhn_sp_s0 ... \
        [--out DIR]

Prints one table per league run and a final comparison; writes `league_curves.png` (and
`league_curves.json`) into each league run directory and, with --out, one plot of every run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from selfplay.config import TrainConfig, load_config  # noqa: E402
from selfplay.evaluation.evaluate import find_candidates  # noqa: E402
from selfplay.evaluation.exploitability import exploitability_of, move_probabilities  # noqa: E402
from selfplay.evaluation.meta_strategy import expected_payoffs, meta_strategy, mixture_probabilities  # noqa: E402
from selfplay.evaluation.training_curve import read_evaluations  # noqa: E402
from selfplay.league.standings import open_league  # noqa: E402
from selfplay.rollouts import RolloutSettings  # noqa: E402
from selfplay.run_dir import RunDir  # noqa: E402

GAME = "kuhn_poker"
KING_AFTER_CHECK = "2p"  # the second player's information state holding a King after a check
BET = 1  # OpenSpiel's Kuhn Poker actions: 0 pass, 1 bet


def saved_config(run_dir: Path) -> TrainConfig:
    return load_config(str(RunDir(run_dir).saved_config()), [])


def games_per_step(config: TrainConfig) -> int:
    """Games the whole run plays in one step: every learning player's."""
    learners = 1 + (config.league.main_exploiters + config.league.league_exploiters if config.league.enabled else 0)
    return learners * config.rollout.games_per_step


def self_play_curve(run_dir: Path) -> list[tuple[int, float]]:
    """(games played, exploitability of the latest policy) at each of the run's evaluations."""
    per_step = games_per_step(saved_config(run_dir))
    return [
        (e.step * per_step, e.figures[f"eval/{GAME}/exploitability"])
        for e in read_evaluations(RunDir(run_dir).eval_log)
    ]


def league_curve(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """Rows for each step where the main player was frozen, and for each exploiter snapshot
    (see the module's docstring)."""
    config = saved_config(run_dir)
    asked = RolloutSettings.from_config(config.rollout)
    per_step = games_per_step(config)
    with open_league(run_dir) as store:
        snapshots = sorted((p for p in store.players() if p.kind == "snapshot"), key=lambda p: p.created_step)
    policies = {}
    for snapshot in snapshots:
        (candidate,) = find_candidates([str(run_dir / snapshot.weights)])
        model, tokenizer = candidate.network()
        policies[snapshot.name] = move_probabilities(model, tokenizer, GAME, asked)

    def mixture_at(step: int, mains_only: bool = False) -> tuple[dict, float]:
        """The meta-Nash mixture over every snapshot taken by `step` (or the main player's only),
        and its exploitability."""
        population = [s.name for s in snapshots if s.created_step <= step and (s.parent == "main" or not mains_only)]
        meta = meta_strategy(GAME, {name: policies[name] for name in population})
        return mixture_probabilities(GAME, [policies[n] for n in population], meta.weights), meta.exploitability

    mains = [s for s in snapshots if s.parent == "main"]
    rows = []
    for main in mains:
        mixture, mixture_exploitability = mixture_at(main.created_step)
        rows.append(
            {
                "step": main.created_step,
                "games": main.created_step * per_step,
                "snapshots": sum(s.created_step <= main.created_step for s in snapshots),
                "main": exploitability_of(GAME, policies[main.name]),
                "mixture": mixture_exploitability,
                "main_mixture": mixture_at(main.created_step, mains_only=True)[1],
                "main_king_bets_after_check": policies[main.name][KING_AFTER_CHECK][BET],
                "mixture_king_bets_after_check": mixture[KING_AFTER_CHECK][BET],
            }
        )
    found = []
    for exploiter in (s for s in snapshots if s.parent != "main"):
        step = exploiter.created_step
        main = [m for m in mains if m.created_step <= step][-1]  # the latest main snapshot by then
        mixture, mixture_exploitability = mixture_at(step - 1)  # the population it trained against
        values = expected_payoffs(GAME, [policies[exploiter.name], policies[main.name], mixture])
        found.append(
            {
                "exploiter": exploiter.name,
                "step": step,
                "main": main.name,
                "vs_main": values[0, 1],
                "best_vs_main": exploitability_of(GAME, policies[main.name]),
                "vs_mixture": values[0, 2],
                "best_vs_mixture": mixture_exploitability,
            }
        )
    return rows, found


def print_league(run_dir: Path, rows: list[dict], found: list[dict]) -> None:
    print(f"\n{run_dir}: exploitability (exact) where the main player was frozen")
    print("step | games | snapshots | main | mixture | mixture of main's | K bets after a check: main | mixture")
    for r in rows:
        print(
            f"{r['step']} | {r['games']} | {r['snapshots']} | {r['main']:.4f} | {r['mixture']:.4f} | "
            f"{r['main_mixture']:.4f} | "
            f"{r['main_king_bets_after_check']:.2f} | {r['mixture_king_bets_after_check']:.2f}"
        )
    print("\nwhat each exploiter won when frozen, beside a best response's winnings (exact, per hand)")
    print("exploiter | against | won | best | against the mixture before it | won | best")
    for f in found:
        print(
            f"{f['exploiter']} | {f['main']} | {f['vs_main']:+.4f} | {f['best_vs_main']:.4f} | | "
            f"{f['vs_mixture']:+.4f} | {f['best_vs_mixture']:.4f}"
        )


def plot(ax, self_play: dict[str, list], leagues: dict[str, list[dict]]) -> None:
    for name, curve in self_play.items():
        ax.plot(*zip(*curve), color="tab:blue", alpha=0.7, label=f"self-play, latest ({name})")
    for name, rows in leagues.items():
        games = [r["games"] for r in rows]
        ax.plot(games, [r["main"] for r in rows], color="tab:orange", alpha=0.7, label=f"league, main ({name})")
        ax.plot(games, [r["mixture"] for r in rows], color="tab:green", alpha=0.9, label=f"league, mixture ({name})")
    ax.axhline(0.05, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("games played (all learning players)")
    ax.set_ylabel("exploitability (exact)")
    ax.legend(fontsize=6)


def save_plot(path: Path, self_play: dict[str, list], leagues: dict[str, list[dict]]) -> None:
    figure, ax = plt.subplots(figsize=(8, 5))
    plot(ax, self_play, leagues)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--league", nargs="*", default=[], type=Path, help="league run directories")
    parser.add_argument("--self-play", nargs="*", default=[], type=Path, help="self-play run directories")
    parser.add_argument("--out", type=Path, help="a directory for the plot of every run")
    args = parser.parse_args()
    self_play = {str(run): self_play_curve(run) for run in args.self_play}
    leagues = {}
    for run in args.league:
        rows, found = league_curve(run)
        leagues[str(run)] = rows
        print_league(run, rows, found)
        (run / "league_curves.json").write_text(json.dumps({"main": rows, "exploiters": found}, indent=1))
        save_plot(run / "league_curves.png", self_play, {str(run): rows})
    print("\nfinal exploitability (exact)")
    for name, curve in self_play.items():
        print(f"self-play {name}: latest {curve[-1][1]:.4f} after {curve[-1][0]} games")
    for name, rows in leagues.items():
        last = rows[-1]
        print(f"league {name}: main {last['main']:.4f}, mixture {last['mixture']:.4f} after {last['games']} games")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        save_plot(args.out / "league_curves.png", self_play, leagues)


if __name__ == "__main__":
    main()
