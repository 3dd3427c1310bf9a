"""The PSRO mode: payoff entries with intervals against hand-computed values, the meta-game's
members and evaluation games, the psro rule drawing the solved mixture, and a tiny league run
in which the main player trains against the population's meta-strategy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from selfplay.cli import main
from selfplay.config import load_config
from selfplay.errors import UserError
from selfplay.league.exploiter_stopping import ExactCheck
from selfplay.league.manager import League
from selfplay.league.matchmaking import choose_opponent
from selfplay.league.meta_game import evaluation_matches, members, solve_meta_game
from selfplay.league.payoff import PayoffTable
from selfplay.league.records import LeagueMatch, LeaguePlayer
from selfplay.league.store import LeagueStore
from selfplay.run_dir import RunDir
from selfplay.train import Trainer, train_command

KUHN = "kuhn_poker"
SEATS = ("player_0", "player_1")


def _match(a: str, b: str, reward_a: float, reward_b: float | None = None, step: int = 1) -> LeagueMatch:
    reward_b = -reward_a if reward_b is None else reward_b
    return LeagueMatch(step, KUHN, 0, (a, b), SEATS, (0, 0), (reward_a, reward_b), "game_over")


def test_payoff_returns_carry_mean_standard_error_and_interval():
    table = PayoffTable(decay=0.5)  # the decay touches the win counts, never the returns
    for reward in (1.0, -1.0, 0.0):
        table.add(_match("a", "b", reward))
    table.add(_match("b", "a", -2.0))  # a wins 2 from the other seat
    returns = table.pair_returns("a", "b")
    # a's returns 1, -1, 0, 2: mean 1/2, sample variance (6 - 4 / 4) / 3 = 5/3, standard error
    # sqrt(5/3 / 4), and Student's t(0.975, 3 degrees of freedom) = 3.182446 of them on each side.
    assert (returns.games, returns.mean, returns.variance) == (4, 0.5, pytest.approx(5 / 3))
    assert returns.standard_error == pytest.approx(math.sqrt(5 / 12))
    half = 3.182446 * math.sqrt(5 / 12)
    assert returns.interval() == pytest.approx([0.5 - half, 0.5 + half], abs=1e-6)
    assert table.pair_returns("b", "a").mean == -0.5
    # A game that is not zero-sum counts half the difference of the rewards.
    table.add(_match("a", "c", 3.0, 1.0))
    assert table.pair_returns("a", "c").mean == 1.0 and math.isnan(table.pair_returns("a", "c").standard_error)
    assert table.pair_returns("a", "c").interval() is None  # one game
    table.add(_match("a", "c", 3.0, 1.0))
    assert table.pair_returns("a", "c").interval() is None  # two alike: no spread to measure
    means, errors, games = table.return_matrix(["a", "b", "d"])
    assert means[0, 1] == 0.5 and errors[1, 0] == pytest.approx(math.sqrt(5 / 12)) and games[0, 1] == 4
    assert math.isnan(means[0, 2]) and games[0, 2] == 0 and means[1, 1] == 0
    table.forget("a")
    assert table.pair_returns("a", "b").games == 0


def test_a_past_player_joins_the_meta_game_once_it_played_enough_games_with_every_member():
    games = np.array([[0, 8, 8, 3], [8, 0, 8, 8], [8, 8, 0, 8], [3, 8, 8, 0]])
    assert members(games, 8) == [0, 1, 2]  # the last has met the first only 3 times
    assert members(games, 3) == [0, 1, 2, 3]
    assert members(np.zeros((2, 2)), 1) == [0]
    # Its weight is 0 until then; among the members, rock-paper-scissors.
    means = np.array([[0, -1, 1, 5], [1, 0, -1, 5], [-1, 1, 0, 5], [-5, -5, -5, 0.0]])
    assert solve_meta_game("nash", means, games, 8) == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0])


def test_evaluation_games_fill_each_pair_to_the_minimum_with_each_deal_played_from_both_seats():
    games = np.array([[0, 4, 0], [4, 0, 5], [0, 5, 0]])
    matches = evaluation_matches(np.random.default_rng(0), KUHN, ["a", "b", "c"], games, 6)
    pairs = [match.players for match in matches]
    # a-b lacks 2 (one deal), a-c 6 (three deals), b-c 1 (rounded up to one deal).
    assert pairs == [("a", "b"), ("b", "a")] + [("a", "c"), ("c", "a")] * 3 + [("b", "c"), ("c", "b")]
    assert all(first.seed == second.seed for first, second in zip(matches[::2], matches[1::2]))
    assert len({match.seed for match in matches}) == 5 and {match.owner for match in matches} == {None}


def test_the_psro_rule_draws_past_players_by_the_mixture():
    rng = np.random.default_rng(0)
    mixture = {"main@000000": 0.2, "main@000040": 0.5, "random": 0.3}
    draws = [
        choose_opponent(rng, "psro:prd", "main", "main", list(mixture), lambda name: 0.5, {"prd": mixture}.get)
        for _ in range(20_000)
    ]
    assert [draws.count(name) / len(draws) for name in mixture] == pytest.approx(list(mixture.values()), abs=0.01)
    assert choose_opponent(rng, "psro", "main", "main", [], lambda name: 0.5) == "main"  # nobody yet: self-play


def _league(tmp_path, *overrides: str) -> League:
    config = load_config(
        None,
        [
            f"run_dir={tmp_path}",
            f"games={{{KUHN}: 1}}",
            "opponents={psro:nash: 1}",
            "rollout.games_per_step=512",
            "league.enabled=true",
            "league.psro_min_games=4",
            *overrides,
        ],
    )
    store = LeagueStore(RunDir(tmp_path).league_store)
    store.add_players([LeaguePlayer("main", "main", 0), *(_snapshot(name) for name in "rps")])
    return League(config, store)


def _snapshot(name: str) -> LeaguePlayer:
    return LeaguePlayer(name, "snapshot", 0, parent="main", weights=f"{name}.safetensors")


def _rock_paper_scissors(league: League, games: int = 4) -> None:
    """Rock, paper and scissors as snapshots: each wins 1 from the one it beats, `games` times."""
    for winner, loser in (("p", "r"), ("s", "p"), ("r", "s")):
        league.payoff.extend([_match(winner, loser, 1.0)] * games)


def test_the_main_player_meets_the_solved_mixture_and_unmet_pairs_get_evaluation_games(tmp_path):
    league = _league(tmp_path)
    _rock_paper_scissors(league)
    means, _, _ = league.payoff.return_matrix(["r", "p", "s"], KUHN)
    assert means == pytest.approx(np.array([[0, -1, 1], [1, 0, -1], [-1, 1, 0]]))
    assert league.meta_strategy("nash", KUHN) == pytest.approx({"r": 1 / 3, "p": 1 / 3, "s": 1 / 3})
    scheduled = league.schedule(1)
    opponents = [next(p for p in m.players if p != "main") for m in scheduled if m.owner == "main"]
    assert len(opponents) == 512
    assert [opponents.count(name) / 512 for name in "rps"] == pytest.approx([1 / 3] * 3, abs=0.06)
    assert [m for m in scheduled if m.owner is None] == []  # every pair has its 4 games

    # A new snapshot stays out of the mixture until it has played 4 games with each member, which
    # the next step schedules as evaluation games.
    league.players["x"] = _snapshot("x")
    assert set(league.meta_strategy("nash", KUHN)) == {"r", "p", "s"}
    evaluation = [m for m in league.schedule(2) if m.owner is None]
    assert sorted(m.players for m in evaluation) == sorted(
        [(a, "x"), ("x", a)][seat] for a in "rps" for seat in (0, 1) for _ in range(2)
    )
    league.payoff.extend([_match("x", a, 1.0) for a in "rps" for _ in range(4)])
    assert league.meta_strategy("nash", KUHN) == pytest.approx({"x": 1.0})
    metrics = league.metrics(league.record_step(2, [], {}, lambda learner, name: ""))
    assert metrics["league/meta/kuhn_poker/members"] == 4
    # Every member's weight, 0 included (a TensorBoard tag would otherwise keep its last value).
    assert [metrics[f"league/meta/kuhn_poker/nash/{name}"] for name in "rpsx"] == pytest.approx([0, 0, 0, 1])
    league.close()


def test_the_meta_strategy_is_solved_again_when_a_player_joins_though_no_entry_changes(tmp_path):
    league = _league(tmp_path)  # psro_min_games=4
    # B wins 1 in every game: its mean return stays 1 while its game count reaches the minimum.
    league.payoff.extend([_match("B", "A", 1.0)] * 2)
    assert league.meta_strategy("nash", KUHN, ["A", "B"]) == {"A": 1.0}  # B has not joined yet
    league.payoff.extend([_match("B", "A", 1.0)] * 2)
    assert league.meta_strategy("nash", KUHN, ["A", "B"]) == pytest.approx({"B": 1.0})
    # C and D beat both alike and only draw each other: once both have joined, they share the weight.
    league.payoff.extend([_match(a, b, 1.0) for a in "CD" for b in "AB" for _ in range(4)])
    league.payoff.extend([_match("C", "D", 0.0)] * 4)
    assert league.meta_strategy("nash", KUHN, list("ABCD")) == pytest.approx({"C": 0.5, "D": 0.5})
    league.close()


def test_exact_payoffs_fill_the_meta_game_at_once_and_ask_each_ordered_pair_once(tmp_path):
    beats = {("p", "r"), ("s", "p"), ("r", "s"), ("x", "r"), ("x", "p"), ("x", "s")}
    asked = []

    def exact_return(game: str, player: str, opponent: str) -> float:
        asked.append((game, player, opponent))
        return 1.0 if (player, opponent) in beats else -1.0

    league = _league(tmp_path, "league.psro_payoffs=exact")
    league.exact_return = exact_return
    # No game between snapshots has been played, and none is scheduled to measure them.
    assert league.meta_strategy("nash", KUHN) == pytest.approx({"r": 1 / 3, "p": 1 / 3, "s": 1 / 3})
    assert sorted(asked) == sorted((KUHN, a, b) for a in "rps" for b in "rps" if a != b)
    assert [m for m in league.schedule(1) if m.owner is None] == []
    # A new snapshot joins at once; only its own pairs are computed.
    league.players["x"] = _snapshot("x")
    assert league.meta_strategy("nash", KUHN) == pytest.approx({"x": 1.0})
    assert len(asked) == 6 + 6
    metrics = league.metrics(league.record_step(2, [], {}, lambda learner, name: ""))
    assert metrics["league/meta/kuhn_poker/members"] == 4
    assert "league/meta/kuhn_poker/max_stderr" not in metrics  # exact entries have no sampling error
    league.close()


def test_an_exploiter_with_a_psro_rule_hunts_the_meta_strategy_of_the_population_at_its_restart(tmp_path):
    beats = {("p", "r"), ("s", "p"), ("r", "s"), ("x", "r"), ("x", "p"), ("x", "s")}
    league = _league(
        tmp_path,
        "league.psro_payoffs=exact",
        "league.league_exploiters=1",
        "league.league_exploiter_opponents={psro:nash: 1}",
        "league.exploiter_lora_rank=0",
    )
    league.exact_return = lambda game, player, opponent: 1.0 if (player, opponent) in beats else -1.0
    exploiter = LeaguePlayer("league_exploiter_0", "league_exploiter", 0)
    league.players[exploiter.name] = exploiter
    # A snapshot taken after the exploiter started: the main player's meta-strategy is all on it,
    # the exploiter's target stays rock-paper-scissors.
    league.players["x"] = LeaguePlayer("x", "snapshot", 5, parent="main", weights="x.safetensors")
    assert league.meta_strategy("nash", KUHN) == pytest.approx({"x": 1.0})
    assert league.target_weights(exploiter, KUHN) == pytest.approx({"r": 1 / 3, "p": 1 / 3, "s": 1 / 3})
    scheduled = league.schedule(6)
    met = {
        owner: [next(p for p in m.players if p != owner) for m in scheduled if m.owner == owner]
        for owner in ("main", exploiter.name)
    }
    assert set(met["main"]) == {"x"}
    assert [met[exploiter.name].count(name) / 512 for name in "rps"] == pytest.approx([1 / 3] * 3, abs=0.06)
    league.close()


def test_exact_payoffs_need_model_players_and_a_game_probed_at_every_information_state(tiny_model_dir, tmp_path):
    base = [f"model={tiny_model_dir}", "league.enabled=true", f"run_dir={tmp_path}", "opponents={psro:nash: 1}"]
    with pytest.raises(UserError, match="league.scripted adds random: drop them, or set league.psro_payoffs=games"):
        load_config(None, [*base, "league.psro_payoffs=exact", "league.scripted=[random]"])
    with pytest.raises(UserError, match="'tictactoe' has more than 5000 information states.*psro_payoffs=games"):
        Trainer(load_config(None, [*base, "league.psro_payoffs=exact", "games={tictactoe: 1}"]), progress=False)


def test_psro_rules_name_a_known_solver_two_player_games_and_the_main_player(tiny_model_dir, tmp_path):
    base = [f"model={tiny_model_dir}", "league.enabled=true", f"run_dir={tmp_path}"]
    with pytest.raises(UserError, match="psro:nash, psro:prd, psro:alpharank"):
        Trainer(load_config(None, [*base, "opponents={psro:fictitious: 1}"]), progress=False)
    with pytest.raises(UserError, match="proposer_solver seat more or fewer"):
        Trainer(load_config(None, [*base, "opponents={psro: 1}", "games={proposer_solver: 1}"]), progress=False)
    overrides = [*base, "league.main_exploiters=1", "league.main_exploiter_opponents={psro:prd: 1}"]
    with pytest.raises(UserError, match="set league.psro_payoffs=exact, or give psro rules to the main player"):
        Trainer(load_config(None, overrides), progress=False)


def _train_tiny_psro_league(tiny_model_dir, tmp_path, *overrides: str) -> tuple[dict, list[LeagueMatch]]:
    """A tiny Kuhn Poker league run, snapshots every step, with `overrides`: its last metrics and its matches."""
    base = [
        f"games={{{KUHN}: 1}}",
        "rollout.games_per_step=4",
        "rollout.max_new_tokens=4",
        "league.enabled=true",
        "league.snapshot_every=1",
        f"model={tiny_model_dir}",
        f"run_dir={tmp_path}",
    ]
    metrics = train_command(None, [*base, *overrides], resume=None, progress=False)
    with LeagueStore(RunDir(tmp_path).league_store) as store:
        return metrics, store.matches()


@pytest.mark.slow
def test_a_tiny_psro_league_trains_the_main_player_against_its_meta_strategy(tiny_model_dir, tmp_path, capsys):
    metrics, matches = _train_tiny_psro_league(
        tiny_model_dir, tmp_path, "steps=3", "opponents={psro:alpharank: 1}", "league.psro_min_games=2"
    )
    by_step = {step: [m.players for m in matches if m.step == step] for step in (1, 2, 3)}
    # Step 1: the initial snapshot alone is the meta-game. After it, main@000001 plays it twice
    # (one deal, both seats) before it joins; then main@000002 plays both of them.
    assert {p for players in by_step[1] for p in players} == {"main", "main@000000"}
    assert sorted(p for p in by_step[2] if "main" not in p) == [
        ("main@000000", "main@000001"),
        ("main@000001", "main@000000"),
    ]
    evaluation = sorted(p for p in by_step[3] if "main" not in p)
    assert len(evaluation) == 4 and all("main@000002" in p for p in evaluation)
    assert {p for players in by_step[3] for p in players if p != "main"} <= {
        "main@000000",
        "main@000001",
        "main@000002",
    }
    assert metrics["league/meta/kuhn_poker/members"] == 3
    assert sum(value for tag, value in metrics.items() if tag.startswith("league/meta/kuhn_poker/alpharank/")) == (
        pytest.approx(1.0)
    )
    # `league show --meta` solves the meta-strategy with the run's own meta-solver.
    assert main(["league", "show", str(tmp_path), "--meta", KUHN]) == 0
    meta = capsys.readouterr().out.split("Meta-strategy in kuhn_poker: ")[1]
    assert meta.startswith("the alpha-rank mixture over the active snapshots") and "Nash" not in meta


@pytest.mark.slow
def test_a_psro_league_on_exact_payoffs_plays_no_evaluation_games(tiny_model_dir, tmp_path):
    metrics, matches = _train_tiny_psro_league(
        tiny_model_dir,
        tmp_path,
        "steps=2",
        "opponents={psro:nash: 1}",
        "rollout.decoding=legal",
        "league.psro_payoffs=exact",
    )
    assert matches and all("main" in m.players for m in matches)  # every game trained the main player
    assert {p for m in matches if m.step == 2 for p in m.players} <= {"main", "main@000000", "main@000001"}
    assert metrics["league/meta/kuhn_poker/members"] == 3
    weights = [value for tag, value in metrics.items() if tag.startswith("league/meta/kuhn_poker/nash/")]
    assert len(weights) == 3 and sum(weights) == pytest.approx(1.0)


# Rock, paper and scissors, and x, which beats all three: their exact returns against each other.
BEATS = {("p", "r"), ("s", "p"), ("r", "s"), ("x", "r"), ("x", "p"), ("x", "s")}
PSRO_ORACLE = (
    "league.psro_payoffs=exact",
    "league.league_exploiters=1",
    "league.league_exploiter_opponents={psro:nash: 1}",
    "league.exploiter_lora_rank=0",
    "league.exploiter_stop=exact",
)


def _oracle_league(tmp_path, *overrides: str) -> tuple[League, LeaguePlayer]:
    """A PSRO league of rock, paper and scissors with a league exploiter started at step 0."""
    league = _league(tmp_path, *PSRO_ORACLE, *overrides)
    league.exact_return = lambda game, player, opponent: 1.0 if (player, opponent) in BEATS else -1.0
    exploiter = LeaguePlayer("league_exploiter_0", "league_exploiter", 0)
    league.players[exploiter.name] = exploiter
    league.store.add_players([exploiter])
    return league, exploiter


@pytest.mark.parametrize("value, games", [(0.05, 2048), (0.2, 512), (0.01, 4096)])
def test_an_exploiter_plays_more_games_the_closer_its_target_is_to_an_equilibrium(tmp_path, value, games):
    league, exploiter = _oracle_league(
        tmp_path, "league.exploiter_games_at_value=0.1", "league.exploiter_max_games_scale=8"
    )
    asked = []
    league.target_value = lambda game, weights: asked.append((game, dict(weights))) or value
    # (0.1 / v)^2 times 512 games, from 1 to 8 times: 4 times at 0.05, once at 0.2, 8 times at 0.01.
    for step in (1, 2):
        scheduled = league.schedule(step)
        assert sum(m.owner == exploiter.name for m in scheduled) == games
        assert sum(m.owner == "main" for m in scheduled) == 512
    # Its target, the meta-strategy at its restart, is valued once: it stays until the next restart.
    assert asked == [(KUHN, pytest.approx({"r": 1 / 3, "p": 1 / 3, "s": 1 / 3}))]
    league.close()


@pytest.mark.parametrize("value, admitted", [(-0.25, False), (0.25, True)])
def test_a_frozen_exploiter_joins_the_population_only_if_it_beats_the_mixture_of_the_moment(tmp_path, value, admitted):
    league, exploiter = _oracle_league(tmp_path, "league.exploiter_admit=beats_mixture")
    # x joined after the exploiter restarted: its target stays rock-paper-scissors, while the
    # population's mixture of the moment is all on x.
    league.players["x"] = LeaguePlayer("x", "snapshot", 1, parent="main", weights="x.safetensors")
    league.store.record_step(1, [], [league.players["x"]])
    judged = []

    def value_against(name: str, game: str, weights) -> float:
        judged.append((name, game, dict(weights)))
        return value

    frozen = []
    check = ExactCheck(value=0.5, best_response_value=0.5)  # a best response's value: the exact rule is met
    changes = league.record_step(
        2,
        [],
        {},
        lambda learner, name: frozen.append(name) or f"{name}.safetensors",
        {exploiter.name: check},
        value_against,
    )
    snapshot = "league_exploiter_0@000002"
    assert frozen == [snapshot] and judged == [(exploiter.name, KUHN, pytest.approx({"x": 1.0}))]
    [stop] = changes.stops
    assert (stop.reason, stop.admitted, stop.mixture_value) == ("exact", admitted, value)
    assert stop.record()["admitted"] is admitted and stop.record()["mixture_value"] == value
    # Not admitted: its snapshot and record are kept, retired at once, and no one draws it.
    assert (snapshot in changes.retired) is not admitted
    assert (snapshot in league.past_players()) is admitted
    league.close()
    with LeagueStore(RunDir(tmp_path).league_store) as store:
        assert {p.name: p.active for p in store.players()}[snapshot] is admitted


def test_a_frozen_exploiter_joins_without_a_judgement_by_default(tmp_path):
    league, exploiter = _oracle_league(tmp_path)
    check = ExactCheck(value=0.5, best_response_value=0.5)
    changes = league.record_step(2, [], {}, lambda learner, name: f"{name}.safetensors", {exploiter.name: check})
    [stop] = changes.stops
    assert (stop.admitted, stop.mixture_value, changes.retired) == (True, None, [])
    assert "league_exploiter_0@000002" in league.past_players()
    league.close()
