"""The evaluation report: `results.json` (every figure), `report.md` (tables) and PNG plots of
each game's primary figure (`game_kinds`: win rate, or mean return), Elo and exploitability by
checkpoint step. The report opens with the pairings in which a model's moves were mostly
invalid (`invalid_move_alarms`) and the summary of what it found (`verdict_summary`, which the
terminal shows too), and says how each model was asked and sampled."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

from selfplay.evaluation.game_kinds import COOPERATIVE, GENERAL_SUM, WIN_LOSS, GameKind, headline
from selfplay.evaluation.paired import ALL_OPPONENTS, summary_line
from selfplay.evaluation.ratings import MIN_ELO_GAMES, elo_text, few_games_warning
from selfplay.evaluation.significance import (
    BETTER,
    FALSE_VERDICTS_NOTE,
    HIGHER,
    LOWER,
    LOWER_IS_BETTER,
    NO_VERDICT,
    WORSE,
    exact_verdict,
)
from selfplay.files import published, replace_text
from selfplay.games import make_game
from selfplay.games.base import declares_answer_grammar

RESULTS_FILE = "results.json"
REPORT_FILE = "report.md"
# A pairing in which more of a model's moves than this were invalid measures its answers' format
# more than its play: most often a model asked otherwise than it was trained.
INVALID_MOVE_ALARM = 0.2
# Games per pairing of a quick evaluation (`selfplay eval --quick`): a first look, whose report says
# that its intervals are wide.
QUICK_EPISODES = 10
QUICK_NOTE = (
    f" **A quick evaluation** (`--quick`, {QUICK_EPISODES} games per pairing): its intervals are wide, and a "
    "difference it finds not significant may show with more games (`--episodes`)."
)
FORMAT_HELP = (
    "A model that has not learnt the answer format can be held to it: --decoding legal lets it write only a legal "
    "move (in a game that lists its moves), --decoding structured only an answer of the form the game declares (in "
    "a free-text game too); in training, rollout.format_credit rewards a well-formed answer on the way to valid moves."
)


def alarm_advice(where: str) -> str:
    """What the alarms of `invalid_move_alarm` in `where` ("the pairings below") mean, and the settings that help."""
    return (
        f"more than {INVALID_MOVE_ALARM:.0%} of a model's moves were invalid in {where}, whose figures then measure "
        "its answers' format more than its play: check that each model is asked as it was trained (--decoding, "
        "--prompt, --max-new-tokens; a model from a run, an exported one and the built-in default are asked as they "
        f"record unless an option says otherwise). {FORMAT_HELP}"
    )


ALARM_ADVICE = alarm_advice("the pairings below")


def write_report(results: dict, out_dir: str | Path) -> Path:
    """Write the JSON, the plots and the Markdown report to `out_dir`, each file whole or not at
    all (`replace_text`, `published`: an interrupt leaves no half-written one); returns the
    report's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    replace_text(out / RESULTS_FILE, json.dumps(results, indent=1, sort_keys=True) + "\n", "the evaluation's results")
    plots = _plots(results, out)
    report = out / REPORT_FILE
    replace_text(report, _markdown(results, plots), "the evaluation report")
    return report


def invalid_move_alarms(results: dict) -> list[str]:
    """One line for each pairing in which a model, the candidate or a model opponent, made more
    than INVALID_MOVE_ALARM invalid moves (`invalid_move_alarm`)."""
    styles = {m["name"]: m["played_with"] for m in [*results["candidates"], *results["model_opponents"]]}
    alarms = []
    for row in results["matches"]:
        rates = {row["candidate"]: row["invalid_move_rate"], row["opponent"]: row.get("opponent_invalid_move_rate")}
        pairing = f"{row['game']}, {row['candidate']} against {row['opponent']}"
        for name, rate in rates.items():
            alarm = None if rate is None else invalid_move_alarm(row["game"], pairing, name, rate, styles[name])
            alarms += [alarm] if alarm else []
    return alarms


def invalid_move_alarm(game: str, where: str, name: str, rate: float, played_with: dict) -> str | None:
    """The line that flags `name`'s moves in `where` (games of `game`) when more than
    INVALID_MOVE_ALARM of them, `rate`, were invalid: who, where, how many, how it was asked and
    sampled, and the decoding that would keep it to valid answers in this game, if it played
    freely; None at a lower rate."""
    if rate <= INVALID_MOVE_ALARM:
        return None
    asked = ", ".join(f"{setting} {value}" for setting, value in played_with.items())
    alarm = f"{where}: {name} made {rate:.0%} invalid moves, asked with {asked}"
    if played_with["decoding"] == "free":
        twin = make_game(game)
        if twin.lists_every_move:
            alarm += " (--decoding legal writes only legal moves in this game)"
        elif declares_answer_grammar(twin):
            alarm += " (--decoding structured writes only answers of this game's form)"
    return alarm


def verdict_summary(results: dict) -> list[str]:
    """What the evaluation found, a line each (sub-lines indented), for the terminal and the
    report's summary: each game's primary figure per opponent and checkpoint; each checkpoint's
    paired comparison with the baseline, per game, and the role figures it changed; the round
    robin's Elo with intervals; the change in exact exploitability; how many verdicts chance makes."""
    lines = []
    pairings: dict[tuple[str, str], list[dict]] = {}
    for row in results["matches"]:
        pairings.setdefault((row["game"], row["opponent"]), []).append(row)
    for (game, opponent), rows in pairings.items():
        figure = headline(rows[0])[0]
        shown = _rate_with_interval if figure == "win rate" else _with_interval
        cells = [f"{r['candidate']} {shown(*headline(r)[1:])}" for r in rows]
        lines.append(f"{game} vs {opponent}, {figure}: {', '.join(cells)}")
    comparison = results["comparison"]
    for name, counts in comparison.get("summary", {}).items():
        lines.append(summary_line(name, counts, comparison["baseline"]))
        for r in comparison["per_game"]:
            if r["candidate"] == name:
                lines.append(f"  {r['game']}: {_with_interval(r['difference'], r['difference_ci95'])} {r['verdict']}")
        for r in comparison["role_figures"]:
            if r["candidate"] == name and r["verdict"] in (HIGHER, LOWER):
                difference = _with_interval(r["difference"], r["difference_ci95"])
                change = f"{r['baseline_mean']:.3f} -> {r['mean']:.3f}, {difference}"
                lines.append(f"  {r['game']} vs {r['opponent']}: {r['figure']} {r['verdict']} ({change})")
    for game, table in results["round_robin"].items():
        if GameKind(**table["kind"]).has_winners:
            elo = ", ".join(
                f"{n} {elo_text(e, ci)}" for n, e, ci in zip(table["players"], table["elo"], table["elo_ci95"])
            )
            lines.append(f"round robin, {game}: Elo {elo}")
            warning = few_games_warning(table["players"], table["wins"], table["draws"], "--episodes")
            lines += [f"  warning: {warning}"] if warning else []
    lines += _exploitability_changes(results)
    if comparison or results["exploitability"]:
        lines.append(FALSE_VERDICTS_NOTE)
    return lines


def _exploitability_changes(results: dict) -> list[str]:
    """Per game, each checkpoint's exact exploitability and, for the others, its verdict against
    the baseline's (`exact_verdict`: by sign)."""
    baseline = results["comparison"].get("baseline")
    lines = []
    for game, rows in groupby(sorted(results["exploitability"], key=lambda r: r["game"]), key=lambda r: r["game"]):
        rows = list(rows)
        base = next((r["exploitability"] for r in rows if r["candidate"] == baseline), None)
        cells = []
        for r in rows:
            verdict = ""
            if base is not None and r["candidate"] != baseline:
                verdict = f" ({exact_verdict(r['exploitability'] - base, LOWER_IS_BETTER)} than {baseline})"
            cells.append(f"{r['candidate']} {r['exploitability']:.4f}{verdict}")
        lines.append(f"exploitability (exact), {game}: {', '.join(cells)}")
    return lines


def _with_interval(value: float, ci: list[float] | None) -> str:
    return f"{value:+.3f}" + ("" if ci is None else f" [{ci[0]:+.3f}, {ci[1]:+.3f}]")


def _rate_with_interval(value: float, ci: list[float]) -> str:
    return f"{value:.3f} [{ci[0]:.2f}, {ci[1]:.2f}]"


def pairing_words(skip: dict) -> str:
    """A pairing that `plan_pairings` (evaluate.py) left out, in words: its game, its opponent and why."""
    return f"{skip['game']} against {skip['opponent']} ({skip['reason'].rstrip('.')})"


@dataclass(frozen=True)
class CheckpointAxis:
    """Where plots put each candidate, by name: at its step when every candidate is a
    checkpoint of one run (a training curve), else one place each, in the candidates' order,
    labelled with its name. A line joins only consecutive checkpoints of one run: lines between
    other models would show a trend that is not there."""

    positions: dict[str, int]
    label: str
    names: list[str] | None  # the tick labels, when candidates are placed by name
    runs: dict[str, str | None]  # the run whose checkpoint each candidate is, if any

    @classmethod
    def of(cls, candidates: list[dict]) -> CheckpointAxis:
        runs = {c["name"]: c["run"] for c in candidates}
        (run, *others) = set(runs.values())
        if run is not None and not others:  # one run's checkpoints
            return cls({c["name"]: c["step"] for c in candidates}, f"step of run {Path(run).name}", None, runs)
        names = [c["name"] for c in candidates]
        return cls({name: i for i, name in enumerate(names)}, "checkpoint", names, runs)

    def draw(self, ax, names: list[str], values: list[float], errors: list[list[float]] | None, label: str) -> None:
        """The candidates `names` (in the candidates' order) at `values`, with error bars of
        `errors` ([below, above] each) where given, in one colour under `label`."""
        color = None
        places = range(len(names))
        for _, joined in groupby(places, key=lambda i: self.runs[names[i]] or f"model {names[i]}"):
            joined = list(joined)
            drawn = ax.errorbar(
                [self.positions[names[i]] for i in joined],
                [values[i] for i in joined],
                yerr=None if errors is None else [[errors[i][side] for i in joined] for side in (0, 1)],
                marker="o",
                capsize=3,
                color=color,
                linestyle="-" if len(joined) > 1 else "none",
                label=label if color is None else None,
            )
            color = drawn.lines[0].get_color()

    def label_axes(self, ax, title: str, ylabel: str) -> None:
        from matplotlib.ticker import MaxNLocator

        ax.set(title=title, xlabel=self.label, ylabel=ylabel)
        if self.names is None:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        else:
            ax.set_xticks(range(len(self.names)), self.names, rotation=30, ha="right", fontsize=8)
            ax.set_xlim(-0.5, len(self.names) - 0.5)  # half a place of room on each side
        ax.legend(fontsize=8)


def _plots(results: dict, out: Path) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axis = CheckpointAxis.of(results["candidates"])
    plots = []
    games = list(dict.fromkeys(r["game"] for r in results["matches"]))
    if games:
        columns = min(3, len(games))
        grid_rows = -(-len(games) // columns)
        fig, axes = plt.subplots(grid_rows, columns, figsize=(4.8 * columns, 3.8 * grid_rows), squeeze=False)
        for ax in axes.flat[len(games) :]:
            ax.set_visible(False)
        for ax, game in zip(axes.flat, games):
            for opponent in dict.fromkeys(r["opponent"] for r in results["matches"] if r["game"] == game):
                rows = [r for r in results["matches"] if r["game"] == game and r["opponent"] == opponent]
                figures = [headline(r) for r in rows]
                values = [value for _, value, _ in figures]
                # An interval missing (fewer than two games) draws as none.
                intervals = [ci or [value, value] for _, value, ci in figures]
                errors = [[value - low, high - value] for value, (low, high) in zip(values, intervals)]
                axis.draw(ax, [r["candidate"] for r in rows], values, errors, f"vs {opponent}")
            figure = figures[0][0]
            axis.label_axes(ax, game, f"{figure} (95% interval)")
            if figure == "win rate":
                ax.set_ylim(-0.02, 1.02)
        caption = (
            "Each game's primary figure by checkpoint, per opponent, with its own 95% interval: bars that "
            "overlap may still differ significantly in the paired comparison, which the verdicts use"
        )
        plots.append(_save(fig, out / "primary.png", caption))
    # Elo only where games are won and lost: in general-sum and cooperative games it measures nothing.
    rated = {game: t for game, t in results["round_robin"].items() if GameKind(**t["kind"]).has_winners}
    if rated:
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for game, table in rated.items():
            # An end that a perfect score leaves open is not drawn.
            errors = [
                [0.0 if low is None else elo - low, 0.0 if high is None else high - elo]
                for elo, (low, high) in zip(table["elo"], table["elo_ci95"])
            ]
            axis.draw(ax, table["players"], table["elo"], errors, game)
        axis.label_axes(ax, "Round robin between checkpoints", "Elo (OpenSpiel fit, 95% interval)")
        caption = "Elo by checkpoint (round robin), with the intervals of its table; an open end is not drawn"
        plots.append(_save(fig, out / "elo.png", caption))
    if results["exploitability"]:
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for game in dict.fromkeys(r["game"] for r in results["exploitability"]):
            rows = [r for r in results["exploitability"] if r["game"] == game]
            axis.draw(ax, [r["candidate"] for r in rows], [r["exploitability"] for r in rows], None, game)
        axis.label_axes(ax, "Exact exploitability", "exploitability (0 = Nash)")
        ax.set_ylim(bottom=0)
        plots.append(_save(fig, out / "exploitability.png", "Exploitability by checkpoint"))
    return plots


def _save(fig, path: Path, caption: str) -> tuple[str, str]:
    fig.tight_layout()
    with published(path, "a plot") as partial:
        fig.savefig(partial, dpi=110, format="png")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path.name, caption


def _markdown(results: dict, plots: list[tuple[str, str]]) -> str:
    settings = results["settings"]
    lines = ["# Evaluation report", ""]
    alarms = invalid_move_alarms(results)
    if alarms:
        lines += [f"> **Warning:** {ALARM_ADVICE}", ">"]
        lines += [f"> - {alarm}" for alarm in alarms] + [""]
    lines += [
        f"Games: {', '.join(settings['games'])}. Opponents: {', '.join(settings['opponents'])}. "
        f"{settings['episodes']} games per pairing, the checkpoint taking each seat in turn, seed {settings['seed']}. "
        "Intervals are 95%: Wilson intervals for rates, Student's t intervals for means (none where every game "
        "gave the same value)." + (QUICK_NOTE if settings["quick"] else ""),
        "",
        "## Summary",
        "",
        *(f"{'  ' if line.startswith(' ') else ''}- {line.strip()}" for line in verdict_summary(results)),
        "",
        *_styles(results),
        "",
        "## Against fixed opponents",
    ]
    for game in dict.fromkeys(r["game"] for r in results["matches"]):
        rows = [r for r in results["matches"] if r["game"] == game]
        kind = GameKind(**rows[0]["kind"])
        lines += [
            "",
            f"### {game}: {_kind_words(kind)}",
            "",
            *_match_table(rows, kind, make_game(game).roles),
            *_role_figures(rows),
        ]
    for skip in results["skipped"]:
        lines.append(f"\nNot played: {pairing_words(skip)}")
    if results["comparison"]:
        lines += ["", *_comparison(results["comparison"])]
    for game, table in results["round_robin"].items():
        lines += ["", f"## Round robin: {game}", "", *_round_robin(table)]
    for skip in results["round_robin_skipped"]:
        lines.append(f"\nNo round robin: {skip['game']} ({skip['reason']})")
    if results["exploitability"]:
        lines += ["", "## Exact exploitability", "", "| checkpoint | game | exploitability |", "|---|---|---|"]
        lines += [f"| {r['candidate']} | {r['game']} | {r['exploitability']:.4f} |" for r in results["exploitability"]]
    for name, caption in plots:
        lines += ["", f"![{caption}]({name})"]
    return "\n".join(lines) + "\n"


def _styles(results: dict) -> list[str]:
    """How each model, candidate or model opponent, was asked and sampled."""
    models = [*results["candidates"], *results["model_opponents"]]
    fixed = results["settings"]["fixed_style"]
    settings = list(models[0]["played_with"])
    lines = [
        "## How each model was asked and sampled",
        "",
        "A model from a run is asked and sampled as its run was (its config's `rollout` section), and an exported "
        "model or the built-in `default` as its directory's record says, except in what the command set for every "
        f"model ({', '.join(fixed) or 'nothing'}); any other model as the command says.",
        "",
        "| model | as recorded | " + " | ".join(settings) + " |",
        "|---|---|" + "---|" * len(settings),
    ]
    for model in models:
        values = [str(model["played_with"][name]) for name in settings]
        lines.append(f"| {model['name']} | {'yes' if model['as_recorded'] else 'no'} | " + " | ".join(values) + " |")
    return lines


def _kind_words(kind: GameKind) -> str:
    if kind.name == WIN_LOSS:
        return "judged by wins, draws and losses (win-lose game; truncated: stopped by the turn cap)"
    if kind.name == GENERAL_SUM:
        return "judged by each side's mean return (general-sum game: nobody wins)"
    if kind.name == COOPERATIVE:
        return "judged by the team's score, the mean return every seat shares (cooperative game: nobody wins)"
    chips = "chip" if kind.big_blind == 1 else "chips"
    poker = f"; mbb/hand: milli-big-blinds per hand, 1 big blind = {kind.big_blind:g} {chips}" if kind.big_blind else ""
    return f"judged by mean return per game (zero-sum game of chance{poker})"


def _match_table(rows: list[dict], kind: GameKind, roles: tuple[str, ...] = ()) -> list[str]:
    """The game's rows against fixed opponents, the primary figure first; each seat's mean return
    headed by the seat's role where the game has roles ("as attacker")."""
    outcomes = ["win", "draw", "loss"] if kind.has_winners else []
    seats = sorted({int(seat) for r in rows for seat in r["seats"]})
    seat_names = {str(seat): f"as {roles[seat]}" if roles else f"seat {seat}" for seat in seats}
    returns = ["mean return", *seat_names.values()] + (["mbb/hand"] if kind.big_blind else [])
    returns += ["opponent's mean return"] if kind.name == GENERAL_SUM else []
    figures = outcomes + ["truncated"] + returns if kind.name == WIN_LOSS else returns + outcomes + ["truncated"]
    opponent_models = any("opponent_invalid_move_rate" in r for r in rows)
    invalid = ["invalid moves", *(["opponent's invalid moves"] if opponent_models else [])]
    header = ["checkpoint", "step", "opponent", "games", *figures, *invalid, "response tokens"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    cells = {
        "win": lambda r: _rate(r, "wins"),
        "draw": lambda r: _rate(r, "draws"),
        "loss": lambda r: _rate(r, "losses"),
        "truncated": lambda r: _rate(r, "truncated"),
        "mean return": lambda r: _mean(r, "mean_return"),
        "mbb/hand": lambda r: _mean(r, "mbb_per_hand", digits=0),
        "opponent's mean return": lambda r: _mean(r, "opponent_mean_return"),
    }
    for seat, name in seat_names.items():
        cells[name] = lambda r, s=seat: _mean(r["seats"][s], "mean_return") if s in r["seats"] else ""
    for r in rows:
        row = [r["candidate"], "" if r["step"] is None else str(r["step"]), r["opponent"], str(r["games"])]
        row += [cells[f](r) for f in figures] + [f"{r['invalid_move_rate']:.3f}"]
        if opponent_models:
            rate = r.get("opponent_invalid_move_rate")
            row.append("" if rate is None else f"{rate:.3f}")
        row.append(f"{r['mean_response_tokens']:.1f}")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def _role_figures(rows: list[dict]) -> list[str]:
    """What each checkpoint's role did in the game's own figures (`TextGame.outcome_figures`)."""
    if not any(r.get("role_figures") for r in rows):
        return []
    lines = ["", "Role figures, over the games that have them:", ""]
    lines += ["| checkpoint | opponent | figure | games | mean |", "|---|---|---|---|---|"]
    for r in rows:
        for name, figure in r.get("role_figures", {}).items():
            ci = figure["ci95"]
            interval = "" if ci is None else f" [{ci[0]:.3f}, {ci[1]:.3f}]"
            lines.append(
                f"| {r['candidate']} | {r['opponent']} | {name} | {figure['games']} | {figure['mean']:.3f}{interval} |"
            )
    return lines


def _comparison(comparison: dict) -> list[str]:
    """Each candidate's paired differences from the baseline, and the summary lines."""
    baseline = comparison["baseline"]
    # A game played against one opponent pools that opponent's games alone: its row says it already.
    opponents = Counter((r["candidate"], r["game"]) for r in comparison["differences"])
    pooled = [r for r in comparison["per_game"] if opponents[r["candidate"], r["game"]] > 1]
    lines = [
        f"## Compared with {baseline}",
        "",
        f"Each checkpoint's score minus {baseline}'s, game by game on the same deals, seats and opponent "
        "seeds: the return (chips in poker) in games judged by mean return, 1 / 0.5 / 0 for a win / draw / "
        f"loss in win-lose games. **Bold**: the 95% interval leaves out 0. {NO_VERDICT.capitalize()}: every "
        "paired difference was the same, so there is no spread to judge it by."
        + (f" Opponent `{ALL_OPPONENTS}` pools every opponent's games." if pooled else ""),
        "",
        "| checkpoint | game | opponent | games | difference | mbb/hand | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = comparison["differences"] + pooled
    order: dict[tuple[str, str], int] = {}  # each game's rows where it first appears, its pooled row after its own
    for i, r in enumerate(rows):
        order.setdefault((r["candidate"], r["game"]), i)
    for r in sorted(rows, key=lambda r: order[r["candidate"], r["game"]]):
        difference = _mean(r, "difference")
        mbb = _mean(r, "mbb_per_hand", digits=0) if "mbb_per_hand" in r else ""
        if r["verdict"] in (BETTER, WORSE):
            difference, mbb = f"**{difference}**", f"**{mbb}**" if mbb else ""
        cells = [r["candidate"], r["game"], r["opponent"], str(r["games"]), difference, mbb, r["verdict"]]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines += [summary_line(name, counts, baseline) for name, counts in comparison["summary"].items()]
    if comparison.get("role_figures"):
        lines += [
            "",
            f"Role figures: each checkpoint's minus {baseline}'s, game by game where both have the figure.",
            "",
            f"| checkpoint | game | opponent | figure | games | checkpoint's | {baseline}'s | difference | verdict |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in comparison["role_figures"]:
            difference = _mean(r, "difference")
            if r["verdict"] in (HIGHER, LOWER):
                difference = f"**{difference}**"
            cells = [r["candidate"], r["game"], r["opponent"], r["figure"], str(r["games"])]
            cells += [f"{r['mean']:.3f}", f"{r['baseline_mean']:.3f}", difference, r["verdict"]]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _round_robin(table: dict) -> list[str]:
    """The mean return matrix, and, in a game with winners, wins and Elo."""
    names = table["players"]
    lines = ["Mean return of the row's checkpoint against the column's:", ""]
    lines += ["| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for name, returns in zip(names, table["mean_returns"]):
        lines.append(f"| {name} | " + " | ".join("" if x is None else f"{x:+.3f}" for x in returns) + " |")
    if not GameKind(**table["kind"]).has_winners:
        return lines
    lines += [
        "",
        "Elo in brackets: a 95% interval, holding the other ratings fixed (the ratings at which the checkpoint's "
        "expected score would be either end of the Wilson interval of the score it made; inf: a perfect score, or "
        f"none, leaves that end open). Under {MIN_ELO_GAMES} decided games a checkpoint's Elo is too uncertain to "
        "rank by.",
        "",
        "| checkpoint | Elo [95%] | wins | draws | truncated | games |",
        "|---|---|---|---|---|---|",
    ]
    for i, name in enumerate(names):
        wins, draws, games = sum(table["wins"][i]), sum(table["draws"][i]), sum(table["games"][i])
        truncated = games - wins - draws - sum(row[i] for row in table["wins"])
        elo = elo_text(table["elo"][i], table["elo_ci95"][i])
        lines.append(f"| {name} | {elo} | {wins} | {draws} | {truncated} | {games} |")
    warning = few_games_warning(names, table["wins"], table["draws"], "--episodes")
    return lines + (["", f"**Warning:** {warning}"] if warning else [])


def _rate(row: dict, outcome: str) -> str:
    return _rate_with_interval(row[f"{outcome}_rate"], row[f"{outcome}_ci95"])


def _mean(row: dict, name: str, digits: int = 3) -> str:
    """A mean with its interval, signed: `name` and `name_ci95` of `row`."""
    ci = row[f"{name}_ci95"]
    interval = "" if ci is None else f" [{ci[0]:+.{digits}f}, {ci[1]:+.{digits}f}]"
    return f"{row[name]:+.{digits}f}{interval}"
