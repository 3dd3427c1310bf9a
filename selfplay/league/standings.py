"""`selfplay league show`: a league's standings, payoff matrix and snapshot lineage, read from
its store, as text or CSV files.

Standings give each player's latest online rating (OpenSkill mu and sigma), an Elo fitted
from every match it played (OpenSpiel's maximum-likelihood fit, undecayed counts, draws
included) with its 95% interval, and its games, wins, draws and losses; a figure a player has
none of (no game yet) is left blank, and such players rank last (a new snapshot's rating is
its parent's, not one it earned). An exploiter that restarted is a new player: the games of
each earlier run of it are its snapshot's, which froze that run, as the league itself counts
them (`League._forget`). The payoff matrices are the league's own, with the decayed counts
matchmaking uses, one per game, seats pooled (payoff.csv keeps them apart). The latest policy
is `main` everywhere: in the standings, the meta-strategy, TensorBoard's tags and the CSV files.
"""

from __future__ import annotations

import csv
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from selfplay.errors import UserError
from selfplay.evaluation.ratings import decided_games, elo_intervals, elo_text, few_games_warning, fit_elo
from selfplay.league.matchmaking import MAIN
from selfplay.league.payoff import PayoffTable, pairwise_outcomes
from selfplay.league.records import LEARNING_KINDS, LeagueMatch, LeaguePlayer
from selfplay.league.store import LeagueStore
from selfplay.run_dir import RunDir

if TYPE_CHECKING:
    from selfplay.config import RolloutConfig


@dataclass(frozen=True)
class Standing:
    player: str
    kind: str
    active: bool
    mu: float | None  # None: never rated (a scripted agent that has met no one)
    sigma: float | None
    elo: float | None  # None: no game against another player
    elo_ci95: list[float | None] | None  # an end None: unbounded (`elo_intervals`)
    games: int
    wins: int
    draws: int
    losses: int

    @property
    def win_rate(self) -> float | None:
        return (self.wins + 0.5 * self.draws) / self.games if self.games else None


@dataclass(frozen=True)
class LeagueRecord:
    """What a league's store holds, read at once."""

    run_dir: str
    players: list[LeaguePlayer]
    matches: list[LeagueMatch]
    ratings: list[tuple[int, str, float, float]]
    last_step: int


def open_league(run_dir: str | Path) -> LeagueStore:
    path = RunDir(run_dir).league_store
    if not path.is_file():
        raise UserError(
            f"'{run_dir}' holds no league ({path.name} is missing). Point at the run directory of a run "
            "trained with league.enabled=true."
        )
    return LeagueStore(path, read_only=True)


def read_league(run_dir: str | Path) -> LeagueRecord:
    with open_league(run_dir) as store:
        return LeagueRecord(str(run_dir), store.players(), store.matches(), store.ratings(), store.last_step())


def by_run(players: list[LeaguePlayer], matches: list[LeagueMatch]) -> list[LeagueMatch]:
    """`matches` with each game an exploiter played before a restart credited to the snapshot
    that froze that run of it (taken at the end of a step, so that step's games are its)."""
    restarts: dict[str, list[tuple[int, str]]] = {}
    for player in players:
        if player.kind == "snapshot" and player.parent is not None and player.parent != MAIN:
            restarts.setdefault(player.parent, []).append((player.created_step, player.name))

    def player_at(name: str, step: int) -> str:
        return next((snapshot for frozen, snapshot in sorted(restarts.get(name, ())) if step <= frozen), name)

    return [replace(m, players=tuple(player_at(name, m.step) for name in m.players)) for m in matches]


def standings(players: list[LeaguePlayer], matches: list[LeagueMatch], ratings: list[tuple]) -> list[Standing]:
    """One row per player, by online rating (best first), those with no game last; each
    exploiter's games since it last restarted (`by_run`)."""
    names = [p.name for p in players]
    wins, draws = _results(names, by_run(players, matches))
    played = [i for i in range(len(names)) if (wins[i] + wins[:, i] + draws[i]).sum()]
    elo: dict[str, tuple[float, list[float | None]] | None] = dict.fromkeys(names)
    if len(played) > 1:
        among = np.ix_(played, played)
        fitted = fit_elo(wins[among].tolist(), draws[among].tolist())
        intervals = elo_intervals(fitted, wins[among].tolist(), draws[among].tolist())
        elo.update({names[i]: figures for i, figures in zip(played, zip(fitted, intervals))})
    latest = {player: (mu, sigma) for _, player, mu, sigma in ratings}
    rows = []
    for i, player in enumerate(players):
        won, drawn, lost = wins[i].sum(), draws[i].sum(), wins[:, i].sum()
        mu, sigma = latest.get(player.name, (None, None))
        rating, interval = elo[player.name] or (None, None)
        games = int(won + drawn + lost)
        rows.append(
            Standing(
                player.name,
                player.kind,
                player.active,
                mu,
                sigma,
                rating,
                interval,
                games,
                *map(int, (won, drawn, lost)),
            )
        )
    return sorted(rows, key=lambda r: (r.games == 0, np.inf if r.mu is None else -r.mu))


def _results(names: list[str], matches: list[LeagueMatch]) -> tuple[np.ndarray, np.ndarray]:
    """(wins, draws) between `names` in `matches`: `[i][j]` the games i won against j, drew with j."""
    index = {name: i for i, name in enumerate(names)}
    wins = np.zeros((len(names), len(names)), dtype=int)
    draws = np.zeros_like(wins)
    for match in matches:
        for i, j, outcome in pairwise_outcomes(match):
            a, b = index[match.players[i]], index[match.players[j]]
            if outcome == 1.0:
                wins[a, b] += 1
            elif outcome == 0.5:
                draws[a, b] += 1
    return wins, draws


def lineage(players: list[LeaguePlayer]) -> list[str]:
    """Per learning player, its snapshots in order (retired ones marked)."""
    lines = []
    for learner in (p for p in players if p.kind in LEARNING_KINDS):
        chain = [
            f"{p.name}{'' if p.active else ' (retired)'}"
            for p in players
            if p.kind == "snapshot" and p.parent == learner.name
        ]
        lines.append(f"{learner.name}: {' -> '.join(chain) if chain else '(no snapshots yet)'}")
    return lines


def payoff_table(matches: list[LeagueMatch], decay: float) -> PayoffTable:
    table = PayoffTable(decay)
    table.extend(matches)
    return table


def format_standings(rows: list[Standing]) -> str:
    header = ("player", "kind", "rating", "±", "elo [95% interval]", "games", "win rate", "w/d/l")
    body = [
        (
            r.player + ("" if r.active else " (retired)"),
            r.kind,
            _figure(r.mu if r.games else None, ".1f"),
            _figure(r.sigma if r.games else None, ".1f"),
            "-" if r.elo is None else elo_text(r.elo, r.elo_ci95),
            str(r.games),
            _figure(r.win_rate, ".2f"),
            f"{r.wins}/{r.draws}/{r.losses}",
        )
        for r in rows
    ]
    return _table(header, body)


def _figure(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def standings_text(league: LeagueRecord) -> str:
    """The standings block of `league show`, which a league run also ends with."""
    names = [p.name for p in league.players]
    wins, draws = _results(names, by_run(league.players, league.matches))
    played = {name for name, count in zip(names, decided_games(wins, draws).sum(axis=1)) if count}
    warning = (
        few_games_warning(*_among(names, wins, draws, played), "steps or rollout.games_per_step") if played else None
    )
    return (
        f"Standings after step {league.last_step} (rating: OpenSkill mu ± sigma; elo: fitted to every match, "
        "over every game; win rate: every game, draws count half; -: no game yet; an exploiter's games since it "
        "last restarted, the earlier ones its snapshot's)\n"
        + format_standings(standings(league.players, league.matches, league.ratings))
        + ("" if warning is None else f"\n{warning}")
    )


def _among(names: list[str], wins: np.ndarray, draws: np.ndarray, kept: set[str]) -> tuple:
    """`names`, `wins` and `draws` cut down to the players in `kept`."""
    index = [i for i, name in enumerate(names) if name in kept]
    among = np.ix_(index, index)
    return [names[i] for i in index], wins[among], draws[among]


def format_payoff(names: list[str], table: PayoffTable, game: str | None = None) -> str:
    """Row player's decayed win rate against the column player (in `game`, or every game), with
    the decayed game count."""
    rates, games = table.matrix(names, game)
    body = [
        (
            name,
            *(
                "-" if i == j or not games[i, j] else f"{rates[i, j]:.2f} ({games[i, j]:.0f})"
                for j in range(len(names))
            ),
        )
        for i, name in enumerate(names)
    ]
    return _table(("row vs column", *names), body)


def _table(header: tuple[str, ...], body: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [header, *body]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def show(run_dir: str | Path, decay: float, csv_dir: str | Path | None = None) -> str:
    """The text `selfplay league show` prints; with `csv_dir`, the tables as CSV files there."""
    league = read_league(run_dir)
    players, matches = league.players, league.matches
    credited = by_run(players, matches)
    table = payoff_table(credited, decay)
    payoffs = []
    for game in dict.fromkeys(m.game for m in matches):
        met = {name for m in credited if m.game == game for name in m.players}
        shown = [p.name for p in players if p.active and p.name in met]
        payoffs.append(f"Payoff in {game}\n{format_payoff(shown, table, game)}")
    text = "\n\n".join(
        [
            f"League of {run_dir}: {len(players)} players, {len(matches)} matches, through step {league.last_step}.",
            standings_text(league),
            "Payoffs, one table a game, seats pooled (payoff.csv, written by --csv DIR, keeps them apart): the row "
            "player's\ndecayed win rate against the column player, draws counting half, and in brackets the decayed "
            "games",
            *payoffs,
            "Snapshot lineage\n" + "\n".join(lineage(players)),
        ]
    )
    if csv_dir is not None:
        rows = standings(players, matches, league.ratings)
        _write_csv(Path(csv_dir), rows, players, matches, league.ratings, table)
        text += f"\n\nWrote standings.csv, payoff.csv, players.csv, matches.csv and ratings.csv to {csv_dir}."
    return text


def _write_csv(directory: Path, rows, players, matches, ratings, table: PayoffTable) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    _csv(directory / "standings.csv", [{**asdict(r), "win_rate": r.win_rate} for r in rows])
    _csv(directory / "players.csv", [asdict(p) for p in players])
    _csv(
        directory / "matches.csv",
        [{k: "|".join(map(str, v)) if isinstance(v, tuple) else v for k, v in asdict(m).items()} for m in matches],
    )
    _csv(directory / "ratings.csv", [dict(zip(("step", "player", "mu", "sigma"), r)) for r in ratings])
    payoff = [
        {
            "game": game,
            "role": role,
            "opponent_role": opponent_role,
            "player": player,
            "opponent": opponent,
            "wins": tally.wins,
            "draws": tally.draws,
            "losses": tally.losses,
        }
        for (player, opponent), slots in table.tallies.items()
        for (game, role, opponent_role), tally in slots.items()
    ]
    _csv(directory / "payoff.csv", payoff)


def _csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as handle:
        if rows:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


# How the report names each meta-solver (`selfplay.evaluation.meta_solvers.SOLVERS`).
SOLVER_NAMES = {"nash": "Nash", "prd": "projected replicator dynamics", "alpharank": "alpha-rank"}


def league_meta_strategy(run_dir: str | Path, game: str, rollout: RolloutConfig, solver: str = "nash") -> str:
    """The meta-strategy report: the mixture meta-solver `solver` gives over the league's active
    snapshots and the main player's latest checkpoint (`main`) in `game` (exact payoffs between
    their policies, each read from the model by the exploitability probe, asked and decoded as
    the run's `rollout` settings ask and decode it), with the exploitability of the mixture and
    of each policy alone."""
    from selfplay.evaluation.exploitability import move_probabilities
    from selfplay.evaluation.meta_strategy import meta_strategy
    from selfplay.model_specs import league_player
    from selfplay.rollouts import RolloutSettings

    with open_league(run_dir) as store:
        snapshots = [p.name for p in store.players() if p.kind == "snapshot" and p.active]
    asked = RolloutSettings.from_config(rollout)
    models = {name: league_player(RunDir(run_dir), name) for name in [*snapshots, MAIN]}
    policies = {name: move_probabilities(*model.network(), game, asked) for name, model in models.items()}
    meta = meta_strategy(game, policies, solver)
    mixture = f"{SOLVER_NAMES[solver]} mixture"
    body = [(name, f"{w:.3f}", f"{e:.4f}") for name, w, e in zip(meta.names, meta.weights, meta.exploitabilities)]
    body.append((mixture, "", f"{meta.exploitability:.4f}"))
    return (
        f"Meta-strategy in {game}: the {mixture} over the active snapshots and {MAIN} (the latest policy, step "
        f"{models[MAIN].step}), solved from their exact expected payoffs against each other\n"
        + _table(("policy", "weight", "exploitability"), body)
        + f"\n\nExploitability: the mixture {meta.exploitability:.4f}, {MAIN} alone {meta.exploitabilities[-1]:.4f}."
    )
