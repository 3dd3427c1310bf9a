"""The league manager: the population, who plays whom each step, and what the results change.

Each step, every learning player (the main player, then each exploiter) gets its games: the
game by weight, its seat alternating, each other seat filled by its matchmaking mix. After
the step the league records every finished match in the payoff table, the online ratings and
the store; freezes learning players whose snapshot rule fires, or exploiters whose stopping
rule does (`exploiter_stopping`), exploiters then restarting from their initial weights; and
retires snapshots beyond the population cap. All of it is a function of the store's records,
so a resumed run rebuilds the league exactly.

An exploiter's opponents stay fixed while it trains: its `main` rule draws the main player's
snapshot taken when it (re)started (one is taken then if the main player was not frozen that
step), and its rules over past players draw from the population as it stood then. The weights
over that population may move: PFSP's follow the exploiter's win rates as the payoff table
records its games, and a psro rule's mixture is solved again as its meta-game fills.

A run without `league.enabled` is a league of one: the main player alone, matched as its
`opponents` say, with no store, and nothing recorded.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from dataclasses import replace as dataclass_replace

import numpy as np

from selfplay.config import TrainConfig
from selfplay.games import make_env
from selfplay.league.exploiter_stopping import (
    ExactCheck,
    ExploiterStop,
    StopReason,
    plateau_test,
    stop_reason,
)
from selfplay.league.matchmaking import (
    MAIN,
    SELF,
    UNIFORM,
    is_fixed,
    is_pfsp,
    is_psro,
    pfsp_probabilities,
    pfsp_weighting,
    psro_solver,
    schedule_matches,
)
from selfplay.league.meta_game import evaluation_matches, members, solve_meta_game
from selfplay.league.payoff import PayoffTable, pairwise_outcomes
from selfplay.league.population import eviction_choice, snapshot_due, snapshot_name
from selfplay.league.ratings import OnlineRatings
from selfplay.league.records import LEARNING_KINDS, LeagueMatch, LeaguePlayer
from selfplay.league.store import LeagueStore
from selfplay.records import Trajectory
from selfplay.rollouts import MatchSpec

# The random stream of a step's evaluation games, apart from every learning player's (its index).
EVALUATION_STREAM = 2**31 - 1


@dataclass
class StepChanges:
    snapshots: list[LeaguePlayer] = field(default_factory=list)
    resets: list[str] = field(default_factory=list)  # exploiters to restart from their initial weights
    retired: list[str] = field(default_factory=list)
    stops: list[ExploiterStop] = field(default_factory=list)  # why each exploiter frozen this step was


def initial_players(config: TrainConfig) -> list[LeaguePlayer]:
    """The population a new league starts with: the main player, the exploiters, the scripted
    agents (the initial policy's snapshot is added by the trainer, which writes its weights)."""
    league = config.league
    players = [LeaguePlayer(MAIN, "main", 0)]
    players += [LeaguePlayer(f"main_exploiter_{i}", "main_exploiter", 0) for i in range(league.main_exploiters)]
    players += [LeaguePlayer(f"league_exploiter_{i}", "league_exploiter", 0) for i in range(league.league_exploiters)]
    players += [LeaguePlayer(spec, "scripted", 0) for spec in league.scripted]
    return players


@functools.cache
def roles_of(game: str) -> tuple[str, ...]:
    """The role of each seat of `game`."""
    env = make_env(game)
    return tuple(env.role(agent) for agent in env.possible_agents)


# (game, player, opponent) -> the player's expected return against the opponent, averaged over the seats.
ExactReturn = Callable[[str, str, str], float]
# (game, past players by probability) -> a best response's expected return against their mixture.
TargetValue = Callable[[str, Mapping[str, float]], float]
# (learning player, game, past players by probability) -> its expected return against their mixture.
ValueAgainst = Callable[[str, str, Mapping[str, float]], float]
# What a meta-strategy is solved from: the meta-game's members (indices) and their mean returns' bytes.
MetaGameKey = tuple[tuple[int, ...], bytes]


class League:
    def __init__(
        self,
        config: TrainConfig,
        store: LeagueStore | None = None,
        exact_return: ExactReturn | None = None,
        target_value: TargetValue | None = None,
    ):
        """The league that `store` holds; without a store, the league of one of a run without
        `league.enabled` (see the module's docstring). Under `league.psro_payoffs=exact`,
        `exact_return` computes the meta-game's entries; under `league.exploiter_games_at_value`,
        `target_value` a best response's value against an exploiter's target."""
        self.config = config
        self.store = store
        self.exact_return = exact_return
        self.exact_returns: dict[tuple[str, str, str], float] = {}  # exact_return's answers: snapshots never change
        self.target_value = target_value
        self.target_values: dict[tuple[str, int], float] = {}  # (exploiter, restart step) -> target_value's answer
        self.payoff = PayoffTable(config.league.payoff_decay)
        self.ratings = OnlineRatings()
        self.players: dict[str, LeaguePlayer] = {}
        # (solver, game, players) -> what the mixture was last solved from, and the mixture.
        self.meta_solutions: dict[tuple[str, str, tuple[str, ...]], tuple[MetaGameKey, dict[str, float]]] = {}
        # Each exploiter's results against its target since it (re)started, in the order played.
        self.target_scores: dict[str, list[float]] = defaultdict(list)
        # Replay the store: each step's matches, then the snapshots taken after them.
        created: dict[int, list[LeaguePlayer]] = {}
        for player in store.players() if store is not None else [LeaguePlayer(MAIN, "main", 0)]:
            self.players[player.name] = player
            created.setdefault(player.created_step, []).append(player)
        matches_by_step: dict[int, list[LeagueMatch]] = {}
        for match in store.matches() if store is not None else []:
            matches_by_step.setdefault(match.step, []).append(match)
        for step in sorted(set(created) | set(matches_by_step)):
            for match in matches_by_step.get(step, []):
                self._add_match(match)
            for player in created.get(step, []):
                if player.parent is not None:
                    self.ratings.inherit(player.name, player.parent)
                    if self.players[player.parent].kind != "main":
                        self._forget(player.parent)

    # -- who is in the league ------------------------------------------------------------------

    def learning_players(self) -> list[LeaguePlayer]:
        return [p for p in self.players.values() if p.kind in LEARNING_KINDS]

    def snapshots(self) -> list[LeaguePlayer]:
        """The active snapshots, oldest first."""
        return [p for p in self.players.values() if p.kind == "snapshot" and p.active]

    def past_players(self) -> list[str]:
        """Who `uniform` and `pfsp` draw from: the active snapshots and the scripted agents."""
        return [p.name for p in self.players.values() if p.kind in ("snapshot", "scripted") and p.active]

    def is_exploiter(self, name: str) -> bool:
        player = self.players.get(name)
        return player is not None and player.kind in ("main_exploiter", "league_exploiter")

    def hunted_main(self, player: LeaguePlayer) -> str:
        """Whom `player`'s `main` rule draws: the main player itself, or for an exploiter the main
        player's snapshot taken when it (re)started."""
        if not self.is_exploiter(player.name):
            return MAIN
        start = self.last_snapshot_step(player.name)
        mains = [p for p in self.players.values() if p.parent == MAIN and p.created_step <= start]
        return max(mains, key=lambda p: p.created_step).name

    def pool(self, player: LeaguePlayer) -> list[str]:
        """The past players `player`'s `uniform`, `pfsp` and `psro` rules draw from: for an
        exploiter, those of the population when it (re)started that are still active (so a psro
        rule makes it PSRO's best-response oracle, hunting that population's meta-strategy)."""
        if not self.is_exploiter(player.name):
            return self.past_players()
        start = self.last_snapshot_step(player.name)
        return [name for name in self.past_players() if self.players[name].created_step <= start]

    def hunts_main(self, player: LeaguePlayer) -> bool:
        mixes = [self.mix(player), *self.config.league.role_opponents.values()]
        return any(weight > 0 for mix in mixes for rule, weight in mix.items() if rule == MAIN)

    def mix(self, player: LeaguePlayer) -> Mapping[str, float]:
        league = self.config.league
        if player.kind == "main_exploiter":
            return league.main_exploiter_opponents
        if player.kind == "league_exploiter":
            return league.league_exploiter_opponents
        return self.config.opponents

    def targets(self, player: LeaguePlayer) -> list[str]:
        """The players its mix can match it against (itself aside): whom its snapshot rule asks
        it to beat."""
        mixes = [self.mix(player), *self.config.league.role_opponents.values()]
        found: list[str] = []
        for rule in (rule for mix in mixes for rule, weight in mix.items() if weight > 0):
            if rule == MAIN and player.name != MAIN:
                found.append(self.hunted_main(player))
            elif rule == UNIFORM or is_pfsp(rule) or is_psro(rule):
                found += self.pool(player)
            elif is_fixed(rule):
                found.append(rule)
        return [name for name in dict.fromkeys(found) if name not in (player.name, SELF)]

    def target_weights(
        self, player: LeaguePlayer, game: str | None = None, pool: Sequence[str] | None = None
    ) -> dict[str, float]:
        """Whom `player`'s mix draws now, by probability (its games against itself left out, PFSP
        weighted by its win rates in `game`): the target its stopping rule scores it against. Its
        rules over past players draw from `pool`, by default `self.pool(player)`."""
        mix = {rule: weight for rule, weight in self.mix(player).items() if rule != SELF and weight > 0}
        pool = self.pool(player) if pool is None else list(pool)
        weights: dict[str, float] = defaultdict(float)
        for rule, weight in mix.items():
            if rule == MAIN:
                weights[self.hunted_main(player)] += weight
            elif is_fixed(rule):
                weights[rule] += weight
            elif pool:
                if rule == UNIFORM:
                    drawn = np.full(len(pool), 1 / len(pool))
                elif is_psro(rule):
                    mixture = self.meta_strategy(psro_solver(rule), game or next(iter(self.config.games)), pool)
                    drawn = [mixture.get(name, 0.0) for name in pool]
                else:
                    rates = [self._win_rate(player.name, name, game) for name in pool]
                    drawn = pfsp_probabilities(rates, pfsp_weighting(rule))
                for name, probability in zip(pool, drawn):
                    weights[name] += weight * float(probability)
        total = sum(weights.values())
        return {name: weight / total for name, weight in weights.items() if weight > 0}

    def games_scale(self, player: LeaguePlayer) -> float:
        """How many times `rollout.games_per_step` games `player` plays a step: under
        `league.exploiter_games_at_value` g, an exploiter plays (g / v)^2 times as many, v being a
        best response's value against its target (computed once a restart: its target stays),
        from 1 to `league.exploiter_max_games_scale` times; 1 for anyone else."""
        league = self.config.league
        if league.exploiter_games_at_value is None or not self.is_exploiter(player.name):
            return 1.0
        restart = (player.name, self.last_snapshot_step(player.name))
        if restart not in self.target_values:
            game = next(iter(self.config.games))
            target = self.target_weights(player, game)
            self.target_values[restart] = self.target_value(game, target) if target else math.inf
        scale = (league.exploiter_games_at_value / max(self.target_values[restart], 1e-9)) ** 2
        return min(max(scale, 1.0), league.exploiter_max_games_scale)

    def last_snapshot_step(self, learner: str) -> int:
        """The step of `learner`'s latest snapshot (0 if none): where an exploiter restarted."""
        return max([p.created_step for p in self.players.values() if p.parent == learner], default=0)

    # -- a step --------------------------------------------------------------------------------

    def schedule(self, step: int) -> list[MatchSpec]:
        """Every learning player's games for `step`, each owned by its player, and the evaluation
        games that fill the PSRO meta-games, owned by none; deterministic in (seed, step)."""
        config = self.config
        starts = config.rollout.games_per_step // config.advantages.group_size
        roles = {game: roles_of(game) for game in config.games}
        scheduled = []
        meta_strategy = functools.cache(self.meta_strategy)
        for index, player in enumerate(self.learning_players()):
            pool = tuple(self.pool(player))
            # The main player's draws do not depend on how many exploiters there are.
            rng = np.random.default_rng([config.seed, step] if index == 0 else [config.seed, step, index])
            scheduled += schedule_matches(
                rng,
                player.name,
                self.mix(player),
                config.games,
                roles,
                max(1, round(starts * self.games_scale(player))),
                config.advantages.group_size,
                main=self.hunted_main(player),
                past_players=pool,
                win_rate=functools.partial(self._win_rate, player.name),
                meta_strategy=functools.partial(meta_strategy, players=pool),
                role_mixes=config.league.role_opponents,
            )
        return scheduled + self._evaluation_matches(step)

    def record_step(
        self,
        step: int,
        trajectories: Sequence[Trajectory],
        versions: Mapping[str, int],
        freeze: Callable[[str, str], str],
        checks: Mapping[str, ExactCheck] = {},
        value_against: ValueAgainst | None = None,
    ) -> StepChanges:
        """Record the step's finished games, then take the snapshots that are due and retire
        what the cap says, all committed to the store at once. `versions` gives each model
        player's policy version; `freeze(learner, snapshot)` writes a learner's weights for a
        new snapshot and returns their path relative to the run directory; `checks` holds the
        exact checks of the exploiters the `exact` rule checked this step, after their update
        (with `league.exploiter_keep_best`, each one's best so far); under `league.exploiter_admit:
        beats_mixture`, `value_against` gives a frozen exploiter's value against the mixture it
        must beat to join the population (read after `freeze`, so of the weights frozen). A
        league of one records nothing."""
        if self.store is None:
            return StepChanges()
        matches = [self._league_match(step, t, versions) for t in trajectories]
        for match in matches:
            self._add_match(match)
        changes = StepChanges()
        for player in self.learning_players():
            reason = self._freeze_reason(step, player, checks.get(player.name))
            if reason is None:
                continue
            if player.kind == "main":
                changes.snapshots.append(self._snapshot(step, player.name, freeze))
                continue
            # Before the snapshot, which restarts its target and joins the population.
            stop = self._stop_record(step, player, reason, checks.get(player.name))
            judging = self.config.league.exploiter_admit == "beats_mixture"
            judged_by = self.target_weights(player, pool=self.past_players()) if judging else {}
            snapshot = self._snapshot(step, player.name, freeze)
            changes.snapshots.append(snapshot)
            if judged_by:
                value = value_against(player.name, next(iter(self.config.games)), judged_by)
                stop = dataclass_replace(stop, admitted=value > 0, mixture_value=value)
                if not stop.admitted:
                    self.players[snapshot.name] = dataclass_replace(snapshot, active=False)
                    changes.retired.append(snapshot.name)
            changes.stops.append(stop)
            self._forget(player.name)
            changes.resets.append(player.name)
        restarted = [self.players[name] for name in changes.resets]
        if any(self.hunts_main(p) for p in restarted) and all(s.parent != MAIN for s in changes.snapshots):
            changes.snapshots.append(self._snapshot(step, MAIN, freeze))  # the restarted exploiters' target
        hunted = {self.hunted_main(p) for p in self.learning_players() if p.kind != "main" and self.hunts_main(p)}
        changes.retired += eviction_choice(
            self.snapshots(), functools.partial(self._win_rate, MAIN), self.config.league.population_cap, hunted
        )
        for name in changes.retired:
            self.players[name] = dataclass_replace(self.players[name], active=False)
        self.store.record_step(step, matches, changes.snapshots, changes.retired, self.ratings.table())
        return changes

    def _freeze_reason(self, step: int, player: LeaguePlayer, check: ExactCheck | None) -> StopReason | None:
        """Why `player` is frozen after `step`, or None: the snapshot rule, or an exploiter's stopping rule."""
        league = self.config.league
        steps_since = step - self.last_snapshot_step(player.name)
        if player.kind == "main" or league.exploiter_stop == "snapshot":
            rates = [
                (self._win_rate(player.name, name), self.payoff.tally(player.name, name).games)
                for name in self.targets(player)
            ]
            due = snapshot_due(
                steps_since,
                rates,
                every=league.snapshot_every,
                win_rate=league.snapshot_win_rate,
                min_games=league.snapshot_min_games,
                max_steps=league.snapshot_max_steps,
            )
            return "snapshot" if due else None
        return stop_reason(
            steps_since,
            league.exploiter_max_steps,
            exact=check,
            fraction=league.exploiter_stop_fraction,
            plateau=self._plateau(player.name) if league.exploiter_stop == "plateau" else None,
        )

    def _plateau(self, exploiter: str):
        league = self.config.league
        return plateau_test(
            self.target_scores[exploiter],
            league.exploiter_plateau_games,
            league.exploiter_plateau_gain,
            league.exploiter_plateau_false_stop,
        )

    def _snapshot(self, step: int, learner: str, freeze: Callable[[str, str], str]) -> LeaguePlayer:
        name = snapshot_name(learner, step)
        snapshot = LeaguePlayer(name, "snapshot", step, parent=learner, weights=freeze(learner, name))
        self.players[name] = snapshot
        self.ratings.inherit(name, learner)
        return snapshot

    def _stop_record(
        self, step: int, player: LeaguePlayer, reason: StopReason, check: ExactCheck | None
    ) -> ExploiterStop:
        scores = self.target_scores[player.name]
        return ExploiterStop(
            exploiter=player.name,
            snapshot=snapshot_name(player.name, step),
            step=step,
            steps=step - self.last_snapshot_step(player.name),
            reason=reason,
            target=self.target_weights(player),
            games=len(scores),
            score=float(np.mean(scores)) if scores else None,
            exact=check,
            plateau=self._plateau(player.name) if self.config.league.exploiter_stop == "plateau" else None,
        )

    # -- the PSRO meta-game --------------------------------------------------------------------

    def meta_strategy(self, solver: str, game: str, players: Sequence[str] | None = None) -> dict[str, float]:
        """The mixture over `players` (by default every past player) that meta-solver `solver`
        gives the meta-game of `game` (selfplay/league/meta_game.py), by name, players of no
        weight left out; solved again whenever a player joins or leaves it or a game changes its
        mean returns."""
        players = list(self.past_players() if players is None else players)
        if not players:
            return {}
        means, games = self._meta_game(players, game)
        # The mixture depends on who has joined and on the entries between them, nothing else.
        joined = members(games, self.config.league.psro_min_games)
        key = tuple(joined), means[np.ix_(joined, joined)].tobytes()
        solved = self.meta_solutions.get((solver, game, tuple(players)))
        if solved is None or solved[0] != key:
            weights = solve_meta_game(solver, means, games, self.config.league.psro_min_games)
            solved = key, {name: float(weight) for name, weight in zip(players, weights) if weight > 0}
            self.meta_solutions[solver, game, tuple(players)] = solved
        return solved[1]

    def _meta_game(self, players: list[str], game: str) -> tuple[np.ndarray, np.ndarray]:
        """(mean returns, games played) between `players`, row against column: from the payoff
        table, or under `league.psro_payoffs=exact` their exact expected returns, every pair
        counted as having played enough games to join."""
        if self.config.league.psro_payoffs == "games":
            means, _, games = self.payoff.return_matrix(players, game)
            return means, games
        means = np.zeros((len(players), len(players)))
        for i, player in enumerate(players):
            for j, opponent in enumerate(players):
                if i != j:
                    key = (game, player, opponent)
                    if key not in self.exact_returns:
                        self.exact_returns[key] = self.exact_return(*key)
                    means[i, j] = self.exact_returns[key]
        return means, np.full_like(means, self.config.league.psro_min_games)

    def meta_solvers(self) -> list[str]:
        """The meta-solvers the learning players' mixes name (`psro:SOLVER`)."""
        mixes = [*(self.mix(player) for player in self.learning_players()), *self.config.league.role_opponents.values()]
        rules = (rule for mix in mixes for rule, weight in mix.items() if weight > 0 and is_psro(rule))
        return list(dict.fromkeys(psro_solver(rule) for rule in rules))

    def _evaluation_matches(self, step: int) -> list[MatchSpec]:
        """The games that bring every pair of past players to `league.psro_min_games` games in each
        game of the run, where a mix names a psro rule."""
        if self.store is None or not self.meta_solvers() or self.config.league.psro_payoffs == "exact":
            return []
        rng = np.random.default_rng([self.config.seed, step, EVALUATION_STREAM])
        players = self.past_players()
        matches = []
        for game in self.config.games:
            _, _, games = self.payoff.return_matrix(players, game)
            matches += evaluation_matches(rng, game, players, games, self.config.league.psro_min_games)
        return matches

    def _meta_game_metrics(self) -> dict[str, float]:
        """Per game: its meta-game's members and the largest standard error of their mean returns,
        and each meta-solver's weight on each member."""
        metrics = {}
        players = self.past_players()
        for game in self.config.games if self.meta_solvers() and players else ():
            _, errors, games = self.payoff.return_matrix(players, game)
            joined = members(self._meta_game(players, game)[1], self.config.league.psro_min_games)
            metrics[f"league/meta/{game}/members"] = float(len(joined))
            if len(joined) > 1 and self.config.league.psro_payoffs == "games":
                metrics[f"league/meta/{game}/max_stderr"] = float(np.nanmax(errors[np.ix_(joined, joined)]))
            for solver in self.meta_solvers():
                mixture = self.meta_strategy(solver, game)
                for name in (players[index] for index in joined):  # 0 too: a tag keeps its last value
                    metrics[f"league/meta/{game}/{solver}/{name}"] = mixture.get(name, 0.0)
        return metrics

    def metrics(self, changes: StepChanges) -> dict[str, float]:
        """The figures TensorBoard shows after a step with `changes`: the population, the
        snapshots taken, the rating of every active player, scripted ones included, and each
        frozen exploiter's figures against its target (none for a league of one)."""
        if self.store is None:
            return {}
        ratings = self.ratings.table()
        metrics = {"league/snapshots": float(len(self.snapshots())), "league/taken": float(len(changes.snapshots))}
        metrics.update(self._meta_game_metrics())
        for player in self.players.values():
            if player.active and player.name in ratings:
                metrics[f"league/rating/{player.name}"] = ratings[player.name][0]
        for stop in changes.stops:
            figures = stop.record()
            for name in ("steps", "score", "value", "best_response_value"):
                if figures[name] is not None:
                    metrics[f"{stop.exploiter}/stop/{name}"] = float(figures[name])
        return metrics

    def close(self) -> None:
        if self.store is not None:
            self.store.close()

    def add_initial_snapshot(self, weights: str) -> None:
        """The initial policy as the league's first past player."""
        snapshot = LeaguePlayer(snapshot_name(MAIN, 0), "snapshot", 0, parent=MAIN, weights=weights)
        self.players[snapshot.name] = snapshot
        self.ratings.inherit(snapshot.name, MAIN)
        self.store.add_players([snapshot])

    # -- internals -----------------------------------------------------------------------------

    def _win_rate(self, player: str, opponent: str, game: str | None = None) -> float:
        return self.payoff.win_rate(player, opponent, game)

    def _forget(self, exploiter: str) -> None:
        """An exploiter restarting from its initial weights is a new player: its results and
        rating so far belong to the snapshot just taken."""
        self.payoff.forget(exploiter)
        self.ratings.forget(exploiter)
        self.target_scores.pop(exploiter, None)

    def _add_match(self, match: LeagueMatch) -> None:
        self.payoff.add(match)
        self.ratings.add(match)
        for i, _, outcome in pairwise_outcomes(match):
            if self.is_exploiter(match.players[i]):  # an exploiter meets only itself and its targets
                self.target_scores[match.players[i]].append(outcome)

    def _league_match(self, step: int, trajectory: Trajectory, versions: Mapping[str, int]) -> LeagueMatch:
        result = trajectory.result
        return LeagueMatch(
            step=step,
            game=result.game,
            seed=result.seed,
            players=result.players,
            roles=roles_of(result.game),
            versions=tuple(versions.get(name, -1) for name in result.players),
            rewards=result.rewards,
            end_reason=result.end_reason,
        )
