"""`selfplay eval`: how checkpoints play games against fixed opponents and against each other.

For each checkpoint (every checkpoint of a run directory, or any model), each game and each
opponent, the checkpoint plays `episodes` games, taking each seat in turn with the opponent in
every other seat (in a game of N players, N - 1 copies of the opponent): its mean return per
game (the game's own payoff: chips, points) with a 95% interval, in milli-big-blinds per hand
too in poker, and its wins, draws and losses with 95% Wilson intervals (none in a general-sum
or cooperative game; a win is the highest return alone, a loss any other seat's higher), per
seat and overall, the share of games stopped by a turn cap (truncated: neither won, drawn nor
lost), the invalid-move rate and the mean response length. Which of these judges play in a
game follows its kind (`game_kinds`). Each checkpoint's difference from a baseline checkpoint
is measured game by game on the same deals (`paired`). Then, optionally, a round robin
between the checkpoints in each two-player game, with its mean return matrix and Elo fitted
by OpenSpiel (games of more players are left out of it, with the reason in the report), and
the exact exploitability of each checkpoint where the game is small enough (Kuhn Poker,
Leduc Hold'em).

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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Annotated

import numpy as np
from tqdm import tqdm

from selfplay.backends import PolicyBackend
from selfplay.checkpoint import STATE_FILE, checkpoint_problem, checkpoint_step, latest_checkpoint, list_checkpoints
from selfplay.config import MAX_EPISODES, Bounds, build_section, find_yaml, load_config, read_yaml
from selfplay.errors import UserError
from selfplay.evaluation.exploitability import SUPPORTED_GAMES
from selfplay.evaluation.game_kinds import GENERAL_SUM, GameKind, mbb_per_hand
from selfplay.evaluation.paired import paired_comparison
from selfplay.evaluation.ratings import fit_elo
from selfplay.evaluation.scoreboard import game_outcome, mean_interval, wilson_interval
from selfplay.games import make_game
from selfplay.records import Trajectory
from selfplay.rollouts import MatchSpec, RolloutEngine, RolloutSettings
from selfplay.run_dir import RunDir

POLICY = "policy"  # the label of the evaluated model in its games against fixed opponents
OUTCOMES = ("wins", "draws", "losses", "truncated")


@dataclass(frozen=True)
class Candidate:
    """A policy to evaluate: a checkpoint of a run (with its step) or any model."""

    name: str
    model: str  # a model directory, a hub name, or "default"
    step: int | None = None
    weights: str | None = None  # a league snapshot's safetensors file, loaded over `model`

    def policy(self, backend: str) -> PolicyBackend:
        from selfplay.match import load_policy

        policy = load_policy(self.model, backend)
        if self.weights is not None:
            policy.load_weights(Path(self.weights), version=self.step or 0)
        return policy

    def network(self):
        """The candidate as a transformers model (for probes) and its tokenizer."""
        import torch
        from safetensors.torch import load_model
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from selfplay.default_model import resolve_model

        path = resolve_model(self.model)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        if self.weights is not None:
            load_model(model, self.weights)
        return model, AutoTokenizer.from_pretrained(path)


@dataclass(frozen=True)
class EvalSettings:
    games: tuple[str, ...]
    opponents: tuple[str, ...] = ("random",)
    episodes: int = 50  # per checkpoint, game and opponent (and per pair in the round robin)
    seed: int = 0
    rollout: RolloutSettings = field(default_factory=RolloutSettings)
    backend: str = "hf"
    round_robin: bool = True
    exploitability: bool = True
    baseline: str | None = None  # the candidate that paired comparisons difference from; None: the first


def find_candidates(specs: Sequence[str]) -> list[Candidate]:
    """Each spec is a run directory (all its whole checkpoints, oldest first; damaged ones are
    named in one warning line and left out), one checkpoint directory, a league snapshot
    (`RUN_DIR/league/snapshots/NAME.safetensors`), or a model (directory, hub name or "default")."""
    found: list[Candidate] = []
    for spec in specs:
        path = Path(spec)
        checkpoints = list_checkpoints(path)
        if path.suffix == ".safetensors":
            found.append(_snapshot_candidate(path))
        elif checkpoints:
            problems = {c: checkpoint_problem(c) for c in checkpoints}
            damaged = [f"{c.name} ({problem})" for c, problem in problems.items() if problem]
            if damaged:
                print(f"warning: left out the damaged checkpoints of '{spec}': {'; '.join(damaged)}", file=sys.stderr)
            found += [_checkpoint_candidate(c) for c, problem in problems.items() if not problem]
        elif (path / STATE_FILE).exists():
            problem = checkpoint_problem(path)
            if problem:
                raise UserError(f"Checkpoint '{spec}' is damaged ({problem}): evaluate another one.")
            found.append(_checkpoint_candidate(path))
        elif path.is_dir() and not (path / "config.json").exists():
            raise UserError(
                f"'{spec}' is neither a run directory with checkpoints, a checkpoint, nor a model directory "
                "(it has no config.json). Give a run directory such as runs/quickstart, or a model."
            )
        else:
            found.append(Candidate(spec, spec))
    names = [c.name for c in found]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise UserError(f"Checkpoints given twice: {', '.join(duplicates)}.")
    return found


def _snapshot_candidate(path: Path) -> Candidate:
    run = RunDir.of_snapshot(path)
    name, _, step = path.stem.rpartition("@")
    if run is None or not path.is_file() or not run.config.exists() or not step.isdigit():
        layout = RunDir("RUN_DIR")
        raise UserError(
            f"'{path}' is not a league snapshot: expected an existing {layout.snapshot('PLAYER@STEP')} "
            f"inside a run directory with its {layout.config.name}."
        )
    # The run's checkpoints carry the model's configuration and tokenizer as the run used them.
    model = str(latest_checkpoint(run.path)) if list_checkpoints(run.path) else load_config(run.config).model
    return Candidate(path.stem, model, int(step), str(path))


def _checkpoint_candidate(path: Path) -> Candidate:
    return Candidate(f"{path.parent.parent.name}/{path.name}", str(path), checkpoint_step(path))


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
    the other seats' mean return instead; in every kind its truncated games (stopped by a turn
    cap: neither won, drawn nor lost, their returns counted in the means), its invalid-move rate
    over its turns and its mean response length in tokens. `returns` and `outcomes` keep each
    game's in the order of `trajectories`, which paired comparisons rely on (`play_opponents`
    gives the match order). A game ended by an invalid move counts with the returns that
    `InvalidMovePolicy` gave it."""
    games: list[tuple[int, float, float, str]] = []  # (seat, its return, the others' mean, outcome) per game
    turns = invalid = tokens = 0
    for trajectory in trajectories:
        result = trajectory.result
        seat = result.players.index(label)
        others = [r for s, r in enumerate(result.rewards) if s != seat]
        games.append((seat, result.rewards[seat], sum(others) / len(others), game_outcome(result, seat)))
        mine = [t for t in trajectory.turns if t.agent == label]
        turns += len(mine)
        invalid += sum(t.invalid for t in mine)
        tokens += sum(len(t.response_ids) for t in mine)
    seats = sorted({seat for seat, *_ in games})
    return {
        "kind": asdict(kind),
        **_figures([figures for _, *figures in games], kind),
        "seats": {str(seat): _figures([figures for s, *figures in games if s == seat], kind) for seat in seats},
        "returns": [m for _, m, _, _ in games],
        "outcomes": [o for *_, o in games],
        "turns": turns,
        "invalid_move_rate": invalid / turns if turns else 0.0,
        "mean_response_tokens": tokens / turns if turns else 0.0,
    }


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


def plan_pairings(games: Sequence[str], opponents: Sequence[str]) -> tuple[dict[str, list[str]], list[dict]]:
    """The opponents each game can seat, and the (game, opponent, reason) left out because the
    opponent does not apply to the game (`nash` needs hidden information, for instance).
    Unknown games and agent specs raise UserError."""
    from selfplay.agents import IncompatibleAgentError, make_agent

    pairings: dict[str, list[str]] = {}
    skipped = []
    for game in games:
        twin = make_game(game)
        pairings[game] = []
        for opponent in opponents:
            try:
                make_agent(opponent, twin, seed=0)
            except IncompatibleAgentError as err:
                skipped.append({"game": game, "opponent": opponent, "reason": str(err)})
            else:
                pairings[game].append(opponent)
    return pairings, skipped


def play_opponents(
    policy: PolicyBackend,
    pairings: dict[str, list[str]],
    episodes: int,
    seed: int,
    rollout: RolloutSettings,
    on_game: Callable[[], None] = lambda: None,
) -> list[dict]:
    """`policy` against each opponent of each game (`plan_pairings`), taking each seat in turn
    with the opponent in every other seat (`pairing_matches`); one row of `outcome_stats` per
    (game, opponent), its games in the order of their seeds (`match_seeds`), the same deals and
    seats for every policy. `on_game` is called as each game finishes.

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
            for trajectory in RolloutEngine({POLICY: policy, opponent: opponent}, rollout).run(matches):
                trajectories.append(trajectory)
                on_game()
            trajectories.sort(key=lambda t: order[t.result.seed, t.result.players])
            rows.append({"game": game, "opponent": opponent, **outcome_stats(trajectories, POLICY, GameKind.of(twin))})
    return rows


# -- the whole evaluation -------------------------------------------------------------------------


def evaluate(candidates: Sequence[Candidate], settings: EvalSettings, progress: bool = True) -> dict:
    """Every figure of the evaluation, as plain data (what `results.json` holds): each
    candidate against each fixed opponent (`play_opponents`), each one's paired differences
    from the baseline (`paired_comparison`), the round robin and exploitability."""

    if not candidates:
        raise UserError("Nothing to evaluate: give --checkpoints (run directories, checkpoints or models).")
    names = [c.name for c in candidates]
    baseline = settings.baseline or names[0]
    if baseline not in names:
        raise UserError(f"--baseline '{baseline}' is none of the candidates; give one of: {', '.join(names)}.")
    pairings, skipped = plan_pairings(settings.games, settings.opponents)
    pairs = len(candidates) * (len(candidates) - 1) // 2 if settings.round_robin else 0
    seats = {game: make_game(game).num_players for game in settings.games}
    duels = [game for game in settings.games if seats[game] == 2]
    total = len(candidates) * sum(map(len, pairings.values())) * settings.episodes
    total += pairs * len(duels) * settings.episodes
    bar = tqdm(total=total, desc="eval", unit="game", disable=not progress)
    results: dict = {
        "settings": _settings_dict(settings),
        "candidates": [asdict(c) for c in candidates],
        "skipped": skipped,
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
    try:
        for candidate in candidates:
            bar.set_postfix_str(candidate.name)
            policy = candidate.policy(settings.backend)
            try:
                rows = play_opponents(
                    policy,
                    pairings,
                    settings.episodes,
                    settings.seed,
                    settings.rollout,
                    on_game=lambda: bar.update(1),
                )
            finally:
                policy.close()
            results["matches"] += [{"candidate": candidate.name, "step": candidate.step, **row} for row in rows]
        if len(candidates) > 1:
            results["comparison"] = paired_comparison(results["matches"], baseline)
        if pairs and duels:
            bar.set_postfix_str("round robin")
            results["round_robin"] = round_robin(candidates, duels, settings, on_game=lambda: bar.update(1))
    finally:
        bar.close()
    if settings.exploitability:
        results["exploitability"] = exploitabilities(
            candidates, [g for g in settings.games if g in SUPPORTED_GAMES], settings.rollout
        )
    return results


def _settings_dict(settings: EvalSettings) -> dict:
    out = asdict(settings)
    out["rollout"]["invalid_moves"] = asdict(settings.rollout.invalid_moves)
    return json.loads(json.dumps(out))  # tuples as lists, as the JSON file holds them


def round_robin(
    candidates: Sequence[Candidate], games: Sequence[str], settings: EvalSettings, on_game: Callable[[], None]
) -> dict:
    """Every pair of candidates plays `episodes` games of each two-player game, alternating seats; per
    game, the mean return matrix (`mean_returns[i][j]`: i's mean return against j, None on the
    diagonal), the matrices of games played, won and drawn (a truncated game is played, but
    neither won nor drawn) and the Elo ratings OpenSpiel fits to them."""

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
        played = {g: np.zeros((len(labels), len(labels)), dtype=int) for g in games}
        rollout = replace(settings.rollout, sampling=replace(settings.rollout.sampling, seed=settings.seed))
        for trajectory in RolloutEngine(players, rollout).run(matches):
            result = trajectory.result
            a, b = (index[p] for p in result.players)
            returns[result.game][a, b] += result.rewards[0]
            returns[result.game][b, a] += result.rewards[1]
            played[result.game][a, b] += 1
            played[result.game][b, a] += 1
            outcome = game_outcome(result, 0)
            if outcome == "wins":
                wins[result.game][a, b] += 1
            elif outcome == "losses":
                wins[result.game][b, a] += 1
            elif outcome == "draws":
                draws[result.game][a, b] += 1
                draws[result.game][b, a] += 1
            on_game()
    finally:
        for policy in players.values():
            policy.close()
    return {
        game: {
            "players": labels,
            "steps": [c.step for c in candidates],
            "kind": asdict(GameKind.of(make_game(game))),
            "mean_returns": [
                [None if i == j else float(returns[game][i, j] / played[game][i, j]) for j in range(len(labels))]
                for i in range(len(labels))
            ],
            "games": played[game].tolist(),
            "wins": wins[game].tolist(),
            "draws": draws[game].tolist(),
            "elo": fit_elo(wins[game], draws[game]),
        }
        for game in games
    }


def exploitabilities(candidates: Sequence[Candidate], games: Sequence[str], rollout: RolloutSettings) -> list[dict]:
    """Exact exploitability of each candidate's policy in each small game, asked and decoded as
    `rollout` asks and decodes it."""
    if not games:
        return []
    from selfplay.evaluation.exploitability import policy_exploitability

    rows = []
    for candidate in candidates:
        model, tokenizer = candidate.network()
        for game in games:
            value = policy_exploitability(model, tokenizer, game, rollout)
            rows.append({"candidate": candidate.name, "step": candidate.step, "game": game, "exploitability": value})
    return rows
