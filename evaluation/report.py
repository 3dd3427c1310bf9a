"""The evaluation report: `results.json` (every figure), `report.md` (tables) and PNG plots of
win rate, Elo and exploitability by checkpoint step."""

from __future__ import annotations

import json
from pathlib import Path

RESULTS_FILE = "results.json"
REPORT_FILE = "report.md"


def write_report(results: dict, out_dir: str | Path) -> Path:
    """Write the JSON, the plots and the Markdown report to `out_dir`; returns the report's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / RESULTS_FILE).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    plots = _plots(results, out)
    report = out / REPORT_FILE
    report.write_text(_markdown(results, plots))
    return report


def _x_axis(rows: list[dict], names: list[str]) -> tuple[list, str]:
    """Checkpoint steps when every row has one, else the candidates' order."""
    if all(r["step"] is not None for r in rows):
        return [r["step"] for r in rows], "step"
    return [names.index(r["candidate"]) for r in rows], "checkpoint"


def _plots(results: dict, out: Path) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [c["name"] for c in results["candidates"]]
    plots = []
    games = list(dict.fromkeys(r["game"] for r in results["matches"]))
    if games:
        columns = min(3, len(games))
        grid_rows = -(-len(games) // columns)
        fig, axes = plt.subplots(grid_rows, columns, figsize=(4.8 * columns, 3.6 * grid_rows), squeeze=False)
        for ax in axes.flat[len(games) :]:
            ax.set_visible(False)
        for ax, game in zip(axes.flat, games):
            for opponent in dict.fromkeys(r["opponent"] for r in results["matches"] if r["game"] == game):
                rows = [r for r in results["matches"] if r["game"] == game and r["opponent"] == opponent]
                x, label = _x_axis(rows, names)
                rate = [r["wins_rate"] for r in rows]
                low = [r["wins_rate"] - r["wins_ci95"][0] for r in rows]
                high = [r["wins_ci95"][1] - r["wins_rate"] for r in rows]
                ax.errorbar(x, rate, yerr=[low, high], marker="o", capsize=3, label=f"vs {opponent}")
            _label_axes(ax, game, label, "win rate (95% Wilson)")
            ax.set_ylim(-0.02, 1.02)
        plots.append(_save(fig, out / "win_rate.png", "Win rate by checkpoint, per game and opponent"))
    if results["round_robin"]:
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        for game, table in results["round_robin"].items():
            rows = [{"candidate": n, "step": s} for n, s in zip(table["players"], table["steps"])]
            x, label = _x_axis(rows, names)
            ax.plot(x, table["elo"], marker="o", label=game)
        _label_axes(ax, "Round robin between checkpoints", label, "Elo (OpenSpiel fit)")
        plots.append(_save(fig, out / "elo.png", "Elo by checkpoint (round robin)"))
    if results["exploitability"]:
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        for game in dict.fromkeys(r["game"] for r in results["exploitability"]):
            rows = [r for r in results["exploitability"] if r["game"] == game]
            x, label = _x_axis(rows, names)
            ax.plot(x, [r["exploitability"] for r in rows], marker="o", label=game)
        _label_axes(ax, "Exact exploitability", label, "exploitability (0 = Nash)")
        ax.set_ylim(bottom=0)
        plots.append(_save(fig, out / "exploitability.png", "Exploitability by checkpoint"))
    return plots


def _label_axes(ax, title: str, xlabel: str, ylabel: str) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.legend(fontsize=8)


def _save(fig, path: Path, caption: str) -> tuple[str, str]:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path.name, caption


def _markdown(results: dict, plots: list[tuple[str, str]]) -> str:
    settings = results["settings"]
    lines = [
        "# Evaluation report",
        "",
        f"Games: {', '.join(settings['games'])}. Opponents: {', '.join(settings['opponents'])}. "
        f"{settings['episodes']} games per pairing, seats alternating, seed {settings['seed']}, "
        f"sampling temperature {settings['rollout']['sampling']['temperature']}.",
        "",
        "## Against fixed opponents",
        "",
        "| checkpoint | step | game | opponent | games | win | draw | loss | truncated | invalid moves "
        "| response tokens |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["matches"]:
        cells = [r["candidate"], "" if r["step"] is None else str(r["step"]), r["game"], r["opponent"], str(r["games"])]
        cells += [_rate(r, outcome) for outcome in ("wins", "draws", "losses", "truncated")]
        cells += [f"{r['invalid_move_rate']:.3f}", f"{r['mean_response_tokens']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    for skip in results["skipped"]:
        lines.append(f"\nNot played: {skip['game']} against {skip['opponent']} ({skip['reason']})")
    for game, table in results["round_robin"].items():
        lines += ["", f"## Round robin: {game}", "", "| checkpoint | Elo | wins | draws | games |"]
        lines.append("|---|---|---|---|---|")
        for i, name in enumerate(table["players"]):
            wins, draws = sum(table["wins"][i]), sum(table["draws"][i])
            games = wins + draws + sum(row[i] for row in table["wins"])
            lines.append(f"| {name} | {table['elo'][i]:.0f} | {wins} | {draws} | {games} |")
    if results["exploitability"]:
        lines += ["", "## Exact exploitability", "", "| checkpoint | game | exploitability |", "|---|---|---|"]
        lines += [f"| {r['candidate']} | {r['game']} | {r['exploitability']:.4f} |" for r in results["exploitability"]]
    for name, caption in plots:
        lines += ["", f"![{caption}]({name})"]
    return "\n".join(lines) + "\n"


def _rate(row: dict, outcome: str) -> str:
    low, high = row[f"{outcome}_ci95"]
    return f"{row[f'{outcome}_rate']:.3f} [{low:.2f}, {high:.2f}]"
