"""`selfplay eval`: how checkpoints play games against fixed opponents and against each other.

For each checkpoint (every checkpoint of a run directory, or any model spec of
`selfplay.model_specs`), each game and each opponent (a scripted agent, or a fixed model such
as a baseline checkpoint or a league snapshot), the checkpoint plays `episodes` games, taking
each seat in turn with the opponent in every other seat (in a game of N players, N - 1 copies
of the opponent): its mean return per game (the game's own payoff: chips, points) with a 95%
interval, in milli-big-blinds per hand too in poker, and its wins, draws and losses with 95%
Wilson intervals (none in a general-sum or cooperative game; a win is the highest return
alone, a loss any other seat's higher), per seat and overall, the share of games stopped by a
turn cap (truncated: neither won, drawn nor lost), the invalid-move rate and the mean response
length. Which of these judges play in a game follows its kind (`game_kinds`). Each
checkpoint's difference from a baseline checkpoint is measured game by game on the same deals
(`paired`). Then, optionally, a round robin between the checkpoints in each two-player game,
with its mean return matrix and Elo fitted by OpenSpiel (games of more players are left out
of it, with the reason in the report), and the exact exploitability of each checkpoint where
the game is small enough (Kuhn Poker, Leduc Hold'em).

Each model, candidate or opponent, is asked and sampled as its run trained it, except in what
the command sets for every model (`ModelSpec.played_with`); the results say how each was.

Every game's seed derives from the evaluation seed, the game and the opponent, so every
checkpoint meets the same deals; the same seed gives the same figures (timings are kept out
of the results for that reason). One exception: OpenSpiel's information-set MCTS bot (`mcts`
in Kuhn Poker or Leduc Hold'em) moves differently from one process to the next for the same
seed, so those pairings vary between runs; every other pairing is unaffected.
"""

from __future__ import annotations

import json
import sys
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import Annotated

import numpy as np
from tqdm import tqdm

from selfplay.backends import PolicyBackend
from selfplay.checkpoint import checkpoint_problem, list_checkpoints
from selfplay.config import MAX_EPISODES, Bounds, build_section, find_yaml, read_yaml
from selfplay.errors import UserError
from selfplay.evaluation.exploitability import SUPPORTED_GAMES
from selfplay.evaluation.game_kinds import GENERAL_SUM, GameKind, mbb_per_hand
from selfplay.evaluation.paired import paired_comparison
from selfplay.evaluation.ratings import elo_intervals, fit_elo
from selfplay.evaluation.report import QUICK_EPISODES, pairing_words
from selfplay.evaluation.scoreboard import game_outcome
from selfplay.evaluation.significance import figure_interval, mean_interval, wilson_interval
from selfplay.games import make_game
from selfplay.model_specs import STYLE_SETTINGS, ModelSpec, checkpoint_model, model_spec, style_of
from selfplay.records import Trajectory
from selfplay.rollouts import MatchSpec, Player, RolloutEngine, RolloutSettings
from selfplay.run_dir import RunDir

POLICY = "policy"  # the label of the evaluated model in its games against fixed opponents
OUTCOMES = ("wins", "draws", "losses", "truncated")


@dataclass(frozen=True)
class EvalSettings:
    games: tuple[str, ...]
    opponents: tuple[str, ...] = ("random",)
    episodes: int = 50  # per checkpoint, game and opponent (and per pair in the round robin)
    seed: int = 0
    rollout: RolloutSettings = field(default_factory=RolloutSettings)
    # The settings of `rollout` that every model is asked and sampled with; a model from a run
    # takes the others of `STYLE_SETTINGS` from its run (`ModelSpec.played_with`).
    fixed_style: tuple[str, ...] = STYLE_SETTINGS
    backend: str = "hf"
    round_robin: bool = True
    exploitability: bool = True
    baseline: str | None = None  # the candidate that paired comparisons difference from; None: the first
    quick: bool = False  # `episodes` is QUICK_EPISODES in place of the suite's or the default


def find_candidates(specs: Sequence[str]) -> list[ModelSpec]:
    """Each spec is a run directory (all its whole checkpoints, oldest first; damaged ones are
    named in one warning line and left out) or any other model spec (`selfplay.model_specs`: a
    checkpoint, a league player, a model directory, a hub name, default, ...)."""
    found: list[ModelSpec] = []
    for spec in specs:
        checkpoints = list_checkpoints(spec)
        if checkpoints:
            problems = {c: checkpoint_problem(c) for c in checkpoints}
            damaged = [f"{c.name} ({problem})" for c, problem in problems.items() if problem]
            if damaged:
                print(f"warning: left out the damaged checkpoints of '{spec}': {'; '.join(damaged)}", file=sys.stderr)
            found += [checkpoint_model(c) for c, problem in problems.items() if not problem]
        else:
            found.append(model_spec(spec))
    names = [c.name for c in found]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise UserError(f"Checkpoints given twice: {', '.join(duplicates)}.")
    return found


@dataclass(frozen=True)
class Suite:
    games: list[str]
    opponents: list[str] = field(default_factory=lambda: ["random"])
    episodes: Annotated[int, Bounds(1, MAX_EPISODES)] = 50


def load_suite(name: str) -> dict:
    """A suite's settings (`games`, `opponents`, `episodes`) from a YAML file, or from the suite
    of that name installed from `configs/suites/`."""
    path = find_yaml(name, "suite", "suites")
    suite = read_yaml(path, "suite") or {}
    if not isinstance(suite, dict) or set(suite) - {"games", "opponents", "episodes"} or not suite.get("games"):
        raise UserError(f"Suite '{path}' must be a mapping that lists `games` and may set `opponents` and `episodes`.")
    return asdict(build_section(Suite, suite))


# -- games against fixed opponents ----------------------------------------------------------------


def match_seeds(seed: int, game: str, opponent: str, episodes: int) -> list[int]:
    """The seeds of the games against one opponent: the same for every checkpoint."""
    key = [seed, zlib.crc32(game.encode()), zlib.crc32(opponent.encode())]
    return np.random.SeedSequence(key).generate_state(episodes).tolist()


def pairing_matches(game: str, first: str, second: str, seeds: Sequence[int], seats: int = 2) -> list[MatchSpec]:
    """Matches of a game of `seats` seats between `first` and `second`, one a seed: `first`
    takes each seat in turn (seat i % `seats` in the i-th game), `second` every other seat."""
    return [
        MatchSpec(game, tuple(first if seat == i % seats else second for seat in range(seats)), s)
        for i, s in enumerate(seeds)
    ]


def outcome_stats(trajectories: Iterable[Trajectory], label: str, kind: GameKind) -> dict:
    """The figures of `label` over its games, overall and per seat: its mean return with a 95%
    interval (and in milli-big-blinds per hand in poker); in a zero-sum game its wins, draws and
    losses (`game_outcome`) with Wilson intervals, or, in a general-sum game, which nobody wins,
    the other seats' mean return instead; the game's figures of what its role did
    (`TextGame.outcome_figures`); in every kind its truncated games (stopped by a turn cap:
    neither won, drawn nor lost, their returns counted in the means), its invalid-move rate over
    its turns and its mean response length in tokens. `returns`, `outcomes` and
    `role_figure_values` keep each game's in the order of `trajectories`, which paired
    comparisons rely on (`play_opponents` gives the match order). A game ended by an invalid
    move counts with the returns that `InvalidMovePolicy` gave it."""
    trajectories = list(trajectories)
    games: list[tuple[int, float, float | None, str]] = []  # (seat, its return, the others' mean, outcome) per game
    for trajectory in trajectories:
        result = trajectory.result
        seat = result.players.index(label)
        others = [r for s, r in enumerate(result.rewards) if s != seat]
        others_mean = sum(others) / len(others) if others else None  # a one-seat game has no others
        games.append((seat, result.rewards[seat], others_mean, game_outcome(result, seat)))
    turns, invalid, tokens = turn_counts(trajectories, label)
    seats = sorted({seat for seat, *_ in games})
    role_figures = [
        dict(t.result.figures[t.result.players.index(label)]) if t.result.figures else {} for t in trajectories
    ]
    names = sorted({name for figures in role_figures for name in figures})
    values = {name: [figures.get(name) for figures in role_figures] for name in names}
    return {
        "kind": asdict(kind),
        **_figures([figures for _, *figures in games], kind),
        "seats": {str(seat): _figures([figures for s, *figures in games if s == seat], kind) for seat in seats},
        "returns": [m for _, m, _, _ in games],
        "outcomes": [o for *_, o in games],
        # The game's figures of what `label`'s role did (`TextGame.outcome_figures`): the mean of
        # each over the games that have it, and each game's value (None where it has none).
        "role_figures": {name: _figure_mean(per_game) for name, per_game in values.items()},
        "role_figure_values": values,
        "turns": turns,
        "invalid_move_rate": invalid / turns if turns else 0.0,
        # Over turns, as the rate is: a game's turns count as independent trials.
        "invalid_move_ci95": list(wilson_interval(invalid, turns)) if turns else None,
        "mean_response_tokens": tokens / turns if turns else 0.0,
    }


def _figure_mean(per_game: Sequence[float | None]) -> dict:
    """The mean of a role figure over the games that have it, its 95% interval, and how many."""
    present = [v for v in per_game if v is not None]
    mean, ci = figure_interval(present)
    return {"mean": mean, "ci95": ci, "games": len(present)}


def turn_counts(trajectories: Sequence[Trajectory], label: str) -> tuple[int, int, int]:
    """The turns `label` took in `trajectories`: how many, how many were invalid, and their
    response tokens. (Only language models' turns are recorded.)"""
    mine = [turn for trajectory in trajectories for turn in trajectory.turns if turn.agent == label]
    return len(mine), sum(turn.invalid for turn in mine), sum(len(turn.response_ids) for turn in mine)


def _figures(games: list[tuple[float, float, str]], kind: GameKind) -> dict:
    """`outcome_stats`' figures of some games, each given as (its return, the other seats' mean
    return, its `game_outcome`)."""
    out: dict = {"games": len(games)}
    out["mean_return"], out["mean_return_ci95"] = mean_interval([mine for mine, _, _ in games])
    if kind.big_blind is not None:
        ci = out["mean_return_ci95"]
        out["mbb_per_hand"] = mbb_per_hand(out["mean_return"], kind.big_blind)
        out["mbb_per_hand_ci95"] = None if ci is None else [mbb_per_hand(x, kind.big_blind) for x in ci]
    if kind.name == GENERAL_SUM:
        out["opponent_mean_return"], out["opponent_mean_return_ci95"] = mean_interval([t for _, t, _ in games])
    outcomes = [outcome for _, _, outcome in games]
    for outcome in OUTCOMES if kind.has_winners else ("truncated",):
        count = outcomes.count(outcome)
        out[outcome] = count
        out[f"{outcome}_rate"] = count / len(games) if games else 0.0
        out[f"{outcome}_ci95"] = list(wilson_interval(count, len(games)))
    return out


@dataclass(frozen=True)
class Pairings:
    """Which opponents meet the candidates in which game (`plan_pairings`)."""

    games: dict[str, list[str]]  # game -> the opponents (their specs) it seats
    skipped: list[dict]  # (game, opponent, reason) of each opponent that does not apply to a game
    models: dict[str, ModelSpec]  # the opponents that are language models, by spec

    def refusal(self, opponents_setting: str, games_setting: str) -> str:
        """The pairings left out as the end of a sentence ("... cannot play ..."), with the fix: the
        settings that name the opponents and the games, and the games of these each opponent plays."""
        left_out = list(dict.fromkeys(skip["opponent"] for skip in self.skipped))
        plays = {opponent: [game for game, seated in self.games.items() if opponent in seated] for opponent in left_out}
        where = "; ".join(f"{opponent}: {', '.join(games) or 'none of them'}" for opponent, games in plays.items())
        return (
            f"cannot play {'; '.join(map(pairing_words, self.skipped))}. Remove {', '.join(left_out)} from "
            f"{opponents_setting}, or give {games_setting} that {'each' if len(left_out) > 1 else 'it'} plays "
            f"(of these games, {where})"
        )


def plan_pairings(games: Sequence[str], opponents: Sequence[str]) -> Pairings:
    """The opponents each game can seat, and those left out, with the reason, because they do
    not apply to the game (`nash` needs hidden information, for instance). A model opponent
    (`model:SPEC`) plays every game. Unknown games and agent specs, and agents that play in the
    terminal (evaluation plays unattended), raise UserError."""
    from selfplay.agents import IncompatibleAgentError, make_agent
    from selfplay.match import parse_agent

    agents = {opponent: parse_agent(opponent, unattended=True) for opponent in opponents}
    plan = Pairings({}, [], {spec: agent for spec, agent in agents.items() if isinstance(agent, ModelSpec)})
    for game in games:
        twin = make_game(game)
        plan.games[game] = []
        for opponent in opponents:
            try:
                if opponent not in plan.models:
                    make_agent(opponent, twin, seed=0)
            except IncompatibleAgentError as err:
                plan.skipped.append({"game": game, "opponent": opponent, "reason": str(err)})
            else:
                plan.games[game].append(opponent)
    return plan


def play_opponents(
    policy: PolicyBackend,
    pairings: dict[str, list[str]],
    episodes: int,
    seed: int,
    rollout: RolloutSettings,
    on_game: Callable[[Trajectory, Mapping[str, Player]], None] = lambda trajectory, players: None,
    models: Mapping[str, PolicyBackend] = MappingProxyType({}),
    styles: Mapping[str, RolloutSettings] = MappingProxyType({}),
) -> list[dict]:
    """`policy`, asked and sampled as `rollout` says, against each opponent of each game
    (`Pairings.games`), taking each seat in turn with the opponent in every other seat
    (`pairing_matches`); one row of `outcome_stats` per (game, opponent), its games in the order
    of their seeds (`match_seeds`), the same deals and seats for every policy. An opponent in
    `models` is that backend, asked and sampled as `styles` says, and its row has its own
    invalid-move rate too. `on_game` is given each game's trajectory as it ends, with the players
    by label (the policy's is POLICY).

    Each pairing runs in a rollout engine of its own: a batch shares one sampling seed, so
    games sharing batches share their luck, and one pairing's figures stay the same whatever
    else is evaluated beside it."""
    rows = []
    rollout = replace(rollout, sampling=replace(rollout.sampling, seed=seed))
    for game, opponents in pairings.items():
        twin = make_game(game)
        for opponent in opponents:
            seeds = match_seeds(seed, game, opponent, episodes)
            matches = pairing_matches(game, POLICY, opponent, seeds, twin.num_players)
            order = {(m.seed, m.players): i for i, m in enumerate(matches)}
            trajectories = []
            players = {POLICY: policy, opponent: models.get(opponent, opponent)}
            for trajectory in RolloutEngine(players, rollout, styles).run(matches):
                trajectories.append(trajectory)
                on_game(trajectory, players)
            trajectories.sort(key=lambda t: order[t.result.seed, t.result.players])
            row = {"game": game, "opponent": opponent, **outcome_stats(trajectories, POLICY, GameKind.of(twin))}
            if opponent in models:
                turns, invalid, _ = turn_counts(trajectories, opponent)
                row["opponent_invalid_move_rate"] = invalid / turns if turns else 0.0
            rows.append(row)
    return rows


# -- the whole evaluation -------------------------------------------------------------------------


class EvalInterrupted(KeyboardInterrupt):
    """An interrupt stopped an evaluation before its end; the message says how far it had come."""


def evaluate(
    candidates: Sequence[ModelSpec],
    settings: EvalSettings,
    progress: bool = True,
    on_game: Callable[[Trajectory, Mapping[str, Player], Mapping[str, str]], None] = lambda *game: None,
) -> dict:
    """Every figure of the evaluation, as plain data (what `results.json` holds): each
    candidate against each fixed opponent (`play_opponents`), each one's paired differences
    from the baseline (`paired_comparison`), the round robin and exploitability; and how each
    model, candidate or opponent, was asked and sampled (`ModelSpec.played_with`). `on_game` is
    given each game's trajectory as it ends, with the players by label and the names that labels
    stand for (POLICY: the candidate's). An interrupt raises EvalInterrupted."""

    if not candidates:
        raise UserError("Nothing to evaluate: give --checkpoints (run directories, checkpoints or models).")
    names = [c.name for c in candidates]
    baseline = settings.baseline or names[0]
    if baseline not in names:
        raise UserError(f"--baseline '{baseline}' is none of the candidates; give one of: {', '.join(names)}.")
    plan = plan_pairings(settings.games, settings.opponents)
    if not any(plan.games.values()):
        raise UserError(f"Nothing to play: the checkpoints {plan.refusal('--opponents', '--games')}.")
    played = {c.name: c.played_with(settings.rollout, settings.fixed_style) for c in candidates}
    styles = {spec: m.played_with(settings.rollout, settings.fixed_style) for spec, m in plan.models.items()}
    pairs = len(candidates) * (len(candidates) - 1) // 2 if settings.round_robin else 0
    seats = {game: make_game(game).num_players for game in settings.games}
    duels = [game for game in settings.games if seats[game] == 2]
    work = Workload(
        len(candidates),
        sum(map(len, plan.games.values())),
        settings.episodes,
        pairs * len(duels) * settings.episodes,
        settings.quick,
    )
    print(work.line(), file=sys.stderr)
    results: dict = {
        "settings": _settings_dict(settings),
        "candidates": [_model_entry(c.name, c, played[c.name]) for c in candidates],
        "model_opponents": [_model_entry(spec, m, styles[spec]) for spec, m in plan.models.items()],
        "skipped": plan.skipped,
        "matches": [],
        "comparison": {},
        "round_robin": {},
        "round_robin_skipped": [
            {
                "game": game,
                "reason": f"{seats[game]} players: the round robin pairs two checkpoints in a two-player game",
            }
            for game in settings.games
            if pairs and seats[game] != 2
        ],
        "exploitability": [],
    }
    models = {}  # the model opponents, loaded once for every candidate
    bar = tqdm(total=work.games, desc="eval", unit="game", disable=not progress)
    played_games, evaluated = 0, []  # games played; the candidates that have played every opponent

    def finished(
        trajectory: Trajectory, players: Mapping[str, Player], names: Mapping[str, str] = MappingProxyType({})
    ) -> None:
        nonlocal played_games
        played_games += 1
        bar.update(1)
        on_game(trajectory, players, names)

    try:
        try:
            for spec, model in plan.models.items():
                models[spec] = model.policy(settings.backend)
            for candidate in candidates:
                bar.set_postfix_str(candidate.name)
                policy = candidate.policy(settings.backend)
                bar.unpause()  # the time a model takes to load is no game's: left out of the bar's estimate
                try:
                    rows = play_opponents(
                        policy,
                        plan.games,
                        settings.episodes,
                        settings.seed,
                        played[candidate.name],
                        on_game=partial(finished, names={POLICY: candidate.name}),
                        models=models,
                        styles=styles,
                    )
                finally:
                    policy.close()
                results["matches"] += [{"candidate": candidate.name, "step": candidate.step, **row} for row in rows]
                evaluated.append(candidate.name)
            if len(candidates) > 1:
                results["comparison"] = paired_comparison(results["matches"], baseline)
            if pairs and duels:
                bar.set_postfix_str("round robin")
                results["round_robin"] = round_robin(candidates, duels, settings, played, on_game=finished)
        finally:
            bar.close()
            for policy in models.values():
                policy.close()
        if settings.exploitability:
            results["exploitability"] = exploitabilities(
                candidates, [g for g in settings.games if g in SUPPORTED_GAMES], played
            )
    except KeyboardInterrupt:
        raise EvalInterrupted(work.stopped(played_games, evaluated)) from None
    return results


@dataclass(frozen=True)
class Workload:
    """How many games an evaluation plays, said before it starts."""

    checkpoints: int
    pairings: int  # the (game, opponent) pairs that each checkpoint plays
    episodes: int
    round_robin_games: int
    quick: bool

    @property
    def games(self) -> int:
        return self.checkpoints * self.pairings * self.episodes + self.round_robin_games

    def line(self) -> str:
        line = f"eval: {self.games} games to play: {self.checkpoints} checkpoint{'s' * (self.checkpoints != 1)} x "
        line += f"{self.pairings} pairing{'s' * (self.pairings != 1)} x {self.episodes} games"
        if self.round_robin_games:
            line += f", and {self.round_robin_games} in the round robin between checkpoints"
        if self.quick:
            return line + " (--quick)."
        return line + (f"; --quick plays {QUICK_EPISODES} games a pairing." if self.episodes > QUICK_EPISODES else ".")

    def stopped(self, played: int, evaluated: Sequence[str]) -> str:
        """What an evaluation stopped after `played` games had done: `evaluated` are the
        checkpoints that had played every opponent."""
        line = f"the evaluation stopped after {played} of {self.games} games"
        if evaluated:
            line += f", {', '.join(evaluated)} having played every opponent"
        if played == self.games:
            line += " (every game: it was computing exact exploitability)"
        return line + ". It wrote nothing: an unfinished evaluation has no report; run it again for one."


def _model_entry(label: str, model: ModelSpec, played: RolloutSettings) -> dict:
    """What `results.json` says of a model it evaluated or played against: where it comes
    from, and how it was asked and sampled."""
    return {
        "name": label,
        "model": model.model,
        "step": model.step,
        "weights": model.weights,
        "as_recorded": model.trained_with is not None,
        "run": _run_of(model),
        "played_with": style_of(played),
    }


def _run_of(model: ModelSpec) -> str | None:
    """The run directory of which `model` is a checkpoint of the learning player (the ones a
    plot joins into a training curve); None for any other model, a league snapshot or an
    exploiter among them."""
    run = RunDir.of_checkpoint(model.model) if model.weights is None else None
    return str(run.path) if run is not None and Path(model.model).parent == run.checkpoints else None


def _settings_dict(settings: EvalSettings) -> dict:
    out = asdict(settings)
    out["rollout"]["invalid_moves"] = asdict(settings.rollout.invalid_moves)
    return json.loads(json.dumps(out))  # tuples as lists, as the JSON file holds them


def round_robin(
    candidates: Sequence[ModelSpec],
    games: Sequence[str],
    settings: EvalSettings,
    played: Mapping[str, RolloutSettings],
    on_game: Callable[[Trajectory, Mapping[str, Player]], None],
) -> dict:
    """Every pair of candidates plays `episodes` games of each two-player game, alternating seats,
    each candidate asked and sampled as `played` says by its name; per game, the mean return
    matrix (`mean_returns[i][j]`: i's mean return against j, None on the diagonal), the matrices
    of games played, won and drawn (a truncated game is played, but neither won nor drawn), the
    Elo ratings OpenSpiel fits to them and their 95% intervals. `on_game` is given each game's
    trajectory as it ends, with the players by label (each candidate's name)."""

    labels = [c.name for c in candidates]
    index = {label: i for i, label in enumerate(labels)}
    players = {c.name: c.policy(settings.backend) for c in candidates}
    try:
        matches = [
            match
            for game in games
            for i, first in enumerate(labels)
            for second in labels[i + 1 :]
            for match in pairing_matches(
                game, first, second, match_seeds(settings.seed, game, f"{first}|{second}", settings.episodes)
            )
        ]
        wins = {g: np.zeros((len(labels), len(labels)), dtype=int) for g in games}
        draws = {g: np.zeros((len(labels), len(labels)), dtype=int) for g in games}
        returns = {g: np.zeros((len(labels), len(labels))) for g in games}
        games_played = {g: np.zeros((len(labels), len(labels)), dtype=int) for g in games}
        rollout = replace(settings.rollout, sampling=replace(settings.rollout.sampling, seed=settings.seed))
        for trajectory in RolloutEngine(players, rollout, played).run(matches):
            result = trajectory.result
            a, b = (index[p] for p in result.players)
            returns[result.game][a, b] += result.rewards[0]
            returns[result.game][b, a] += result.rewards[1]
            games_played[result.game][a, b] += 1
            games_played[result.game][b, a] += 1
            outcome = game_outcome(result, 0)
            if outcome == "wins":
                wins[result.game][a, b] += 1
            elif outcome == "losses":
                wins[result.game][b, a] += 1
            elif outcome == "draws":
                draws[result.game][a, b] += 1
                draws[result.game][b, a] += 1
            on_game(trajectory, players)
    finally:
        for policy in players.values():
            policy.close()
    return {
        game: {
            "players": labels,
            "steps": [c.step for c in candidates],
            "kind": asdict(GameKind.of(make_game(game))),
            "mean_returns": [
                [None if i == j else float(returns[game][i, j] / games_played[game][i, j]) for j in range(len(labels))]
                for i in range(len(labels))
            ],
            "games": games_played[game].tolist(),
            "wins": wins[game].tolist(),
            "draws": draws[game].tolist(),
            **_elo(wins[game], draws[game]),
        }
        for game in games
    }


def _elo(wins: np.ndarray, draws: np.ndarray) -> dict:
    """The round robin's Elo ratings and each one's 95% interval (`elo_intervals`)."""
    ratings = fit_elo(wins, draws)
    return {"elo": ratings, "elo_ci95": elo_intervals(ratings, wins, draws)}


def exploitabilities(
    candidates: Sequence[ModelSpec], games: Sequence[str], played: Mapping[str, RolloutSettings]
) -> list[dict]:
    """Exact exploitability of each candidate's policy in each small game, asked and decoded as
    `played` says by its name."""
    if not games:
        return []
    from selfplay.evaluation.exploitability import policy_exploitability

    rows = []
    for candidate in candidates:
        model, tokenizer = candidate.network()
        for game in games:
            value = policy_exploitability(model, tokenizer, game, played[candidate.name])
            rows.append({"candidate": candidate.name, "step": candidate.step, "game": game, "exploitability": value})
    return rows
