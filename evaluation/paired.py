"""Paired comparison of candidates with a baseline candidate.

Every candidate plays the same games against a fixed opponent: the same deals (the game's seed
draws every chance outcome), the same seats and the same opponent seeds (`match_seeds`). The
difference between a candidate's score and the baseline's in one such game is free of the
deal's luck, so the mean of these paired differences has a far narrower interval than the
difference of two separately estimated means.

The score of a game follows its kind (`GameKind.score`): 1, 1/2 or 0 for a win, draw or loss in a
win-lose game, the return otherwise (chips in poker, also given in milli-big-blinds per hand). A
win-lose game stopped by a turn cap has no score: its pair is left out.
The verdict on a difference is `significance`'s rule for paired games: better or worse when
its 95% (t) interval leaves out 0, no verdict when every difference is the same nonzero value
(no spread to measure). No correction is made for the number of comparisons. Per game, the
differences against every opponent are pooled into one verdict (the mean over opponents when
each plays the same number of games; the pooled spread includes how the opponents differ,
which only widens the interval).
"""

from __future__ import annotations

from collections.abc import Sequence

from selfplay.evaluation.game_kinds import GENERAL_SUM, GameKind, mbb_per_hand
from selfplay.evaluation.significance import (
    BETTER,
    HIGHER_IS_BETTER,
    NEITHER_IS_BETTER,
    NO_SIGNIFICANT_CHANGE,
    NO_VERDICT,
    WORSE,
    mean_interval,
    sampled_verdict,
)

ALL_OPPONENTS = "all"
VERDICTS = (BETTER, WORSE, NO_SIGNIFICANT_CHANGE, NO_VERDICT)


def paired_differences(candidate: dict, baseline: dict) -> list[float]:
    """Per game, the candidate's score minus the baseline's, from two rows of `outcome_stats`
    of the same game and opponent (their games in the same, seed order); a game that either
    one's truncation left without a score (`GameKind.score`) is left out."""
    if len(candidate["returns"]) != len(baseline["returns"]):
        raise ValueError("paired rows must hold the same games")
    kind = GameKind(**candidate["kind"])
    scores = [
        (kind.score(mine, outcome), kind.score(base, base_outcome))
        for mine, outcome, base, base_outcome in zip(
            candidate["returns"], candidate["outcomes"], baseline["returns"], baseline["outcomes"]
        )
    ]
    return [mine - base for mine, base in scores if mine is not None and base is not None]


def figure_differences(candidate: dict, baseline: dict) -> dict[str, list[float]]:
    """Per role figure (`outcome_stats`' `role_figure_values`), the candidate's value minus the
    baseline's in each game where both have one."""
    base = baseline.get("role_figure_values", {})
    return {
        name: [mine - theirs for mine, theirs in zip(values, base.get(name, ())) if None not in (mine, theirs)]
        for name, values in candidate.get("role_figure_values", {}).items()
    }


def figure_rows(candidate: dict, baseline: dict) -> list[dict]:
    """A row per role figure the two share: each one's mean, and the paired difference with its
    interval; the verdict says only which is higher (or no significant change), since a figure
    may be good high (an attacker's success) or low (a defender's leaks)."""
    rows = []
    for name, differences in figure_differences(candidate, baseline).items():
        if differences:
            row = {"figure": name, "mean": candidate["role_figures"][name]["mean"]}
            row["baseline_mean"] = baseline["role_figures"][name]["mean"]
            row |= difference_row(differences, GameKind(GENERAL_SUM), NEITHER_IS_BETTER)
            rows.append(row)
    return rows


def difference_row(differences: Sequence[float], kind: GameKind, direction: str = HIGHER_IS_BETTER) -> dict:
    """The mean of paired differences, its 95% interval, and the verdict it supports
    (`sampled_verdict`: `direction` says which way the score is good)."""
    mean, ci = mean_interval(differences)
    row = {"games": len(differences), "difference": mean, "difference_ci95": ci}
    row["verdict"] = sampled_verdict(mean, ci, direction)
    if kind.big_blind is not None:
        row["mbb_per_hand"] = mbb_per_hand(mean, kind.big_blind)
        row["mbb_per_hand_ci95"] = None if ci is None else [mbb_per_hand(x, kind.big_blind) for x in ci]
    return row


def paired_comparison(matches: Sequence[dict], baseline: str) -> dict:
    """Each candidate other than `baseline` against it, from the rows of `play_opponents`
    (with `candidate` and `step`): a row per game and opponent, and per game one pooled over
    its opponents (opponent `ALL_OPPONENTS`); and per candidate the number of games on which it
    is significantly better, worse, not significantly different or unjudged (`VERDICTS`), by the
    pooled rows; and a row per role figure of each game and opponent (`figure_rows`)."""
    base = {(m["game"], m["opponent"]): m for m in matches if m["candidate"] == baseline}
    rows: list[dict] = []
    figures: list[dict] = []
    pooled: dict[tuple[str, str], list[float]] = {}
    for match in matches:
        if match["candidate"] == baseline:
            continue
        other = base[match["game"], match["opponent"]]
        differences = paired_differences(match, other)
        keys = {k: match[k] for k in ("candidate", "step", "game", "opponent")}
        rows.append(keys | difference_row(differences, GameKind(**match["kind"])))
        pooled.setdefault((match["candidate"], match["game"]), []).extend(differences)
        figures += [keys | row for row in figure_rows(match, other)]
    steps = {m["candidate"]: m["step"] for m in matches}
    kinds = {m["game"]: GameKind(**m["kind"]) for m in matches}
    games = [
        {"candidate": name, "step": steps[name], "game": game, "opponent": ALL_OPPONENTS}
        | difference_row(differences, kinds[game])
        for (name, game), differences in pooled.items()
    ]
    summary = {}
    for row in games:
        counts = summary.setdefault(row["candidate"], dict.fromkeys(VERDICTS, 0))
        counts[row["verdict"]] += 1
    return {"baseline": baseline, "differences": rows, "per_game": games, "summary": summary, "role_figures": figures}


def summary_line(candidate: str, counts: dict[str, int], baseline: str) -> str:
    """One line: on how many games `candidate` is significantly better than `baseline`, worse,
    or not significantly different (SPIRAL's and MARS's transfer figure, on a held-out suite)."""
    unjudged = f", no verdict on {counts[NO_VERDICT]}" if counts.get(NO_VERDICT) else ""
    return (
        f"{candidate} against {baseline}: significantly better on {counts[BETTER]}, worse on {counts[WORSE]}, "
        f"no significant change on {counts[NO_SIGNIFICANT_CHANGE]}{unjudged} of {sum(counts.values())} games "
        "(95% paired intervals, every opponent's games pooled per game)."
    )
