"""The league: matchmaking rules against their formulas, snapshot and eviction rules, the
decayed payoff table, online ratings, and a league run that survives a crash."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from selfplay import checkpoint
from selfplay.checkpoint import list_checkpoints
from selfplay.cli import main
from selfplay.config import load_config
from selfplay.errors import UserError
from selfplay.evaluation.evaluate import find_candidates
from selfplay.league.exploiter_log import read_stops
from selfplay.league.exploiter_stopping import ExactCheck
from selfplay.league.manager import League, initial_players
from selfplay.league.matchmaking import choose_opponent, pfsp_probabilities, schedule_matches
from selfplay.league.payoff import PayoffTable
from selfplay.league.population import eviction_choice, snapshot_due
from selfplay.league.ratings import OnlineRatings
from selfplay.league.records import LeagueMatch, LeaguePlayer
from selfplay.league.standings import show
from selfplay.league.store import LeagueStore
from selfplay.records import MatchResult, Trajectory
from selfplay.run_dir import RunDir, is_adapter
from selfplay.train import Trainer, train_command

RATES = [0.0, 0.25, 0.5, 0.75, 1.0]


@pytest.mark.parametrize(
    "weighting, weights",
    [
        ("hard", [1.0, 0.5625, 0.25, 0.0625, 0.0]),  # (1 - p)^2
        ("variance", [0.0, 0.1875, 0.25, 0.1875, 0.0]),  # p (1 - p)
        ("linear_capped", [0.5, 0.5, 0.5, 0.25, 0.0]),  # min(0.5, 1 - p)
    ],
)
def test_pfsp_probabilities_follow_their_formulas(weighting, weights):
    expected = np.array(weights) / sum(weights)
    assert pfsp_probabilities(RATES, weighting) == pytest.approx(expected)


def test_pfsp_treats_unmet_players_as_even_and_falls_back_to_uniform():
    # NaN (never met) counts as p = 0.5: hard weights 0.25 and (1 - 0.9)^2 = 0.01.
    assert pfsp_probabilities([float("nan"), 0.9], "hard") == pytest.approx([0.25 / 0.26, 0.01 / 0.26])
    assert pfsp_probabilities([1.0, 1.0, 1.0], "hard") == pytest.approx([1 / 3] * 3)


def test_pfsp_draws_match_the_weights():
    rng = np.random.default_rng(0)
    rates = dict(zip("abcde", RATES))
    draws = [choose_opponent(rng, "pfsp:hard", "me", "main", list(rates), rates.get) for _ in range(20_000)]
    frequencies = np.array([draws.count(name) for name in rates]) / len(draws)
    assert frequencies == pytest.approx(pfsp_probabilities(RATES, "hard"), abs=0.01)


def test_rules_pick_self_main_fixed_and_uniform_past_players():
    rng = np.random.default_rng(0)
    past = ["main@000000", "main@000010", "random"]
    never = lambda name: float("nan")  # noqa: E731
    assert choose_opponent(rng, "self", "me", "main", past, never) == "me"
    assert choose_opponent(rng, "main", "me", "main", past, never) == "main"
    assert choose_opponent(rng, "mcts:10", "me", "main", past, never) == "mcts:10"
    assert choose_opponent(rng, "uniform", "me", "main", [], never) == "me"  # nobody yet: self-play
    draws = [choose_opponent(rng, "uniform", "me", "main", past, never) for _ in range(6000)]
    assert [draws.count(name) / 6000 for name in past] == pytest.approx([1 / 3] * 3, abs=0.03)


def test_role_mixes_fill_seats_of_their_role():
    rng = np.random.default_rng(1)
    roles = {"duel": ("attacker", "defender")}
    matches = schedule_matches(
        rng, "me", {"self": 1.0}, {"duel": 1.0}, roles, 8, 2, role_mixes={"defender": {"random": 1.0}}
    )
    assert len(matches) == 16 and matches[0] == matches[1]  # each start played group_size times
    for index, match in enumerate(matches[::2]):
        # The learner alternates seats; a defender seat it does not take goes to random.
        assert match.players == (("me", "random") if index % 2 == 0 else ("me", "me"))


def test_snapshot_rule_by_steps_by_win_rate_and_by_cap():
    rule = dict(every=0, win_rate=0.7, min_games=10, max_steps=50)
    assert snapshot_due(5, [(0.8, 12), (0.75, 10)], **rule)
    assert not snapshot_due(5, [(0.8, 12), (0.65, 30)], **rule)  # one past player not beaten
    assert not snapshot_due(5, [(0.8, 12), (0.9, 4)], **rule)  # too few games to tell
    assert not snapshot_due(5, [], **rule)
    assert snapshot_due(50, [(0.1, 100)], **rule)  # the cap
    assert snapshot_due(10, [], every=10, win_rate=0, min_games=0, max_steps=0)
    assert not snapshot_due(9, [], every=10, win_rate=0, min_games=0, max_steps=0)
    assert not snapshot_due(0, [(1.0, 99)], **rule)  # just frozen


def _snapshot(name, parent="main", step=0):
    return LeaguePlayer(name, "snapshot", step, parent=parent, weights=f"{name}.safetensors")


def test_eviction_retires_what_main_beats_most_and_keeps_each_newest():
    parents = {"main@1": "main", "x@1": "x", "main@2": "main", "main@3": "main", "x@2": "x"}
    snapshots = [_snapshot(name, parent) for name, parent in parents.items()]
    rates = {"main@1": 0.6, "x@1": 0.9, "main@2": 0.6, "main@3": 0.99, "x@2": 0.99}
    # Newest per parent (main@3, x@2) stay; x@1 (0.9) goes first, then main@1 (ties: the oldest).
    assert eviction_choice(snapshots, rates.get, cap=3) == ["x@1", "main@1"]
    assert eviction_choice(snapshots, rates.get, cap=0) == []
    assert eviction_choice(snapshots[:2], lambda name: float("nan"), cap=1) == []  # each is its parent's newest
    # A snapshot an exploiter is hunting stays too.
    assert eviction_choice(snapshots, rates.get, cap=3, hunted={"x@1"}) == ["main@1", "main@2"]


def _match(a, b, reward_a, game="tictactoe", roles=("player_0", "player_1"), step=1):
    return LeagueMatch(step, game, 0, (a, b), roles, (1, 0), (reward_a, -reward_a), "game_over")


def test_payoff_counts_decay_per_result_and_draws_count_half():
    table = PayoffTable(decay=0.5)
    for reward in (1.0, -1.0, 0.0):  # win, loss, draw
        table.add(_match("a", "b", reward))
    # After the win: w=1; the loss: w=.5, l=1; the draw: w=.25, l=.5, d=1 -> (.25 + .5) / 1.75.
    assert table.win_rate("a", "b") == pytest.approx(0.75 / 1.75)
    assert table.win_rate("b", "a") == pytest.approx(1 - 0.75 / 1.75)
    assert math.isnan(table.win_rate("a", "c"))
    table.add(_match("a", "a", 1.0))  # self-play tells nothing about a against a
    assert math.isnan(table.win_rate("a", "a"))


def test_payoff_keeps_games_and_role_pairings_apart():
    table = PayoffTable()
    table.add(_match("a", "b", 1.0))
    table.add(_match("b", "a", 1.0, roles=("player_0", "player_1")))
    table.add(_match("a", "b", -1.0, game="kuhn_poker"))
    assert table.win_rate("a", "b", "tictactoe") == 0.5 and table.win_rate("a", "b", "kuhn_poker") == 0.0
    assert set(table.tallies["a", "b"]) == {
        ("tictactoe", "player_0", "player_1"),
        ("tictactoe", "player_1", "player_0"),
        ("kuhn_poker", "player_0", "player_1"),
    }
    assert set(table.tallies["b", "a"]) == {
        ("tictactoe", "player_1", "player_0"),
        ("tictactoe", "player_0", "player_1"),
        ("kuhn_poker", "player_1", "player_0"),
    }
    assert table.tallies["a", "b"]["tictactoe", "player_0", "player_1"].wins == 1
    rates, games = table.matrix(["a", "b"])
    assert rates[0, 1] == pytest.approx(1 / 3) and games[0, 1] == 3
    table.forget("a")
    assert math.isnan(table.win_rate("a", "b"))


def test_every_result_of_a_pair_decays_its_counts_whatever_the_seats_and_game():
    # L beats S four times as the first player, then loses four times as the second: the same
    # decayed counts as the same eight results from one seat.
    alternating, one_seat = PayoffTable(decay=0.5), PayoffTable(decay=0.5)
    alternating.extend([_match("L", "S", 1.0)] * 4 + [_match("S", "L", 1.0)] * 4)
    one_seat.extend([_match("L", "S", 1.0)] * 4 + [_match("L", "S", -1.0)] * 4)
    losses = 1 + 0.5 + 0.25 + 0.125
    wins = losses / 16  # decayed by the four losses after them
    for table in (alternating, one_seat):
        tally = table.tally("L", "S")
        assert (tally.wins, tally.losses) == pytest.approx((wins, losses))
        assert table.win_rate("L", "S") == pytest.approx(wins / (wins + losses))  # 0.059
        assert table.win_rate("S", "L") == pytest.approx(losses / (wins + losses))
    # A result in another game decays the pair's counts in this one too.
    alternating.add(_match("L", "S", 0.0, game="kuhn_poker"))
    assert alternating.tally("L", "S", "tictactoe").games == pytest.approx((wins + losses) / 2)
    # At AlphaStar's decay the counts hold the pair's last hundred or so games, the learner
    # alternating seats or not.
    table = PayoffTable(decay=0.99)
    table.extend([_match("a", "b", 1.0), _match("b", "a", 1.0)] * 1000)
    assert table.tally("a", "b").games == pytest.approx(100, rel=1e-6)


def _played(step: int, first: str, second: str, reward_first: float, game: str) -> Trajectory:
    result = MatchResult(game, step, (first, second), (reward_first, -reward_first), (0, 0), 5, "game_over", "main")
    return Trajectory(result, ())


def test_a_league_read_back_from_its_store_has_the_payoff_it_recorded(tmp_path):
    config = load_config(
        None,
        [
            f"run_dir={tmp_path}",
            "games={tictactoe: 1, kuhn_poker: 1}",
            "league.enabled=true",
            "league.payoff_decay=0.5",
            "league.snapshot_min_games=1",
        ],
    )
    store = LeagueStore(RunDir(tmp_path).league_store)
    store.add_players([*initial_players(config), _snapshot("main@000000")])
    league = League(config, store)
    # The main player wins from both seats in both games, then loses so.
    for step, reward in ((1, 1.0), (2, -1.0)):
        played = [_played(step, "main", "main@000000", reward, "tictactoe")]
        played.append(_played(step, "main@000000", "main", -reward, "kuhn_poker"))
        league.record_step(step, played, {"main": step}, lambda learner, name: f"{name}.safetensors")
    # Each game's two wins decayed by the three and two results after them: 0.125 + 0.25 over 1.875.
    assert league.payoff.win_rate("main", "main@000000") == pytest.approx(0.2)
    assert league.payoff.win_rate("main", "main@000000", "kuhn_poker") == pytest.approx(0.25 / 1.25)
    league.close()
    with LeagueStore(RunDir(tmp_path).league_store) as reopened:
        read_back = League(config, reopened).payoff
    assert read_back.tallies == league.payoff.tallies and read_back.returns == league.payoff.returns
    # `league show` and its payoff.csv give the same counts, seat by seat.
    show(tmp_path, 0.5, tmp_path / "csv")
    rows = list(csv.DictReader((tmp_path / "csv" / "payoff.csv").open()))
    assert {
        (row["game"], row["role"], row["opponent_role"], row["player"], row["opponent"]): float(row["wins"])
        for row in rows
    } == {(*slot, *pair): tally.wins for pair, slots in league.payoff.tallies.items() for slot, tally in slots.items()}


def test_online_ratings_move_winners_up_skip_self_play_and_inherit():
    ratings = OnlineRatings()
    ratings.add(_match("a", "b", 1.0))
    (mu_a, sigma_a), (mu_b, _) = ratings.table()["a"], ratings.table()["b"]
    assert mu_a > 25 > mu_b and sigma_a < 25 / 3
    ratings.add(_match("a", "a", 1.0))
    assert ratings.table()["a"] == (mu_a, sigma_a)
    ratings.inherit("a@1", "a")
    assert ratings.table()["a@1"] == (mu_a, sigma_a)


LEAGUE = [
    "steps=3",
    "checkpoint_every=1",
    "keep_checkpoints=5",
    "games={tictactoe: 1, kuhn_poker: 1}",
    "opponents={self: 0.35, pfsp:hard: 0.5, pfsp:variance: 0.15}",
    "rollout.games_per_step=6",
    "rollout.max_new_tokens=4",
    "learner.lr=1e-2",
    "league.enabled=true",
    "league.scripted=[random]",
    "league.main_exploiters=1",
    "league.league_exploiters=1",
    "league.snapshot_every=2",
    "league.population_cap=3",
    "league.exploiter_lora_rank=4",
]


def test_population_rules_that_need_a_league_are_refused_without_one(tiny_model_dir, tmp_path):
    with pytest.raises(UserError, match="league.enabled"):
        Trainer(load_config(None, [f"model={tiny_model_dir}", "opponents={pfsp:hard: 1}"]), progress=False)
    with pytest.raises(UserError, match="no game of this run has; its games' roles: player_0, player_1"):
        load = ["league.enabled=true", "league.role_opponents={solver: {self: 1}}", f"run_dir={tmp_path}"]
        Trainer(load_config(None, [f"model={tiny_model_dir}", *load]), progress=False)
    with pytest.raises(UserError, match="pfsp:hard, pfsp:variance"):
        load = ["league.enabled=true", "opponents={pfsp:soft: 1}", f"run_dir={tmp_path}"]
        Trainer(load_config(None, [f"model={tiny_model_dir}", *load]), progress=False)


@pytest.mark.slow
@pytest.mark.parametrize("lora_rank", [0, 4])  # the main player's: with LoRA every snapshot is an adapter
def test_league_run_snapshots_resets_exploiters_and_resumes_as_it_was(tiny_model_dir, tmp_path, monkeypatch, lora_rank):
    unbroken, broken = tmp_path / "unbroken", tmp_path / "broken"
    common = [*LEAGUE, f"learner.lora.rank={lora_rank}", f"model={tiny_model_dir}"]
    train_command(None, [*common, f"run_dir={unbroken}"], resume=None, progress=False)
    with LeagueStore(RunDir(unbroken).league_store) as store:
        players = {p.name: p for p in store.players()}
        matches = store.matches()
        assert store.last_step() == 3
    learners = ["main", "main_exploiter_0", "league_exploiter_0"]
    # Snapshots at step 0 (the initial policy) and step 2 (snapshot_every); the cap of 3
    # retires the oldest of what main beats, never a learner's newest.
    assert {p.name for p in players.values() if p.kind == "snapshot"} == {
        "main@000000",
        *(f"{name}@000002" for name in learners),
    }
    active = [p.name for p in players.values() if p.kind == "snapshot" and p.active]
    assert len(active) == 3 and {f"{name}@000002" for name in learners} == set(active)
    assert all((unbroken / p.weights).exists() for p in players.values() if p.kind == "snapshot")
    # A LoRA learner's snapshots are its adapters: the exploiters' always here, the main player's with LoRA.
    snapshots = [p for p in players.values() if p.kind == "snapshot"]
    adapters = {p.name for p in snapshots if is_adapter(unbroken / p.weights)}
    assert adapters == {p.name for p in snapshots if lora_rank or p.parent != "main"}
    assert {m.step for m in matches} == {1, 2, 3} and len(matches) == 3 * 6 * 3  # three learners, 6 games each
    assert all(m.versions[m.players.index(p)] == 2 for m in matches for p in m.players if p.endswith("@000002"))

    # Killed while writing step 3's checkpoint, after the exploiters' parts and before the main
    # player's (after step 3's league records): the resumed run takes every player from step 2,
    # forgets step 3's records, replays the step exactly, and ends as the unbroken run did.
    train_command(None, [*common, "steps=2", f"run_dir={broken}"], resume=None, progress=False)
    write = checkpoint._write

    def killed_before_main(directory, step, learner, state):
        if step == 3 and directory.name.endswith(checkpoint.PARTIAL):
            raise Killed
        write(directory, step, learner, state)

    monkeypatch.setattr(checkpoint, "_write", killed_before_main)
    with pytest.raises(Killed):
        train_command(None, ["steps=3"], resume=str(broken), progress=False)
    assert [p.name for p in list_checkpoints(broken)] == ["step-000001", "step-000002"]
    assert (RunDir(broken).checkpoints / ".step-000003.partial" / "exploiters" / "main_exploiter_0").is_dir()
    monkeypatch.setattr(checkpoint, "_write", write)
    train_command(None, ["steps=3"], resume=str(broken), progress=False)
    with LeagueStore(RunDir(broken).league_store) as store, LeagueStore(RunDir(unbroken).league_store) as whole:
        assert store.matches() == matches
        assert store.players() == list(players.values())
        assert store.ratings() == whole.ratings()
    # Every file of the step's checkpoint, bit for bit: weights, optimizer states, random state
    # and each player's baselines (the main player's and both exploiters').
    resumed, whole = _files(RunDir(broken).checkpoints), _files(RunDir(unbroken).checkpoints)
    assert sorted(resumed) == sorted(whole)
    assert [name for name in whole if resumed[name] != whole[name]] == []
    # And every snapshot's weights.
    assert _files(broken / "league") == _files(unbroken / "league")
    assert "step-000003/exploiters/main_exploiter_0/adapter/adapter_model.safetensors" in whole


class Killed(BaseException):
    """A kill -9 where it is raised: nothing of the process runs on."""


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_league_show_prints_standings_payoff_lineage_and_meta_strategy(tiny_model_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    overrides = [
        *LEAGUE[:-5],
        "steps=2",
        "league.snapshot_every=1",
        "league.population_cap=0",
        "opponents={self: 0.4, random: 0.3, pfsp:hard: 0.3}",  # random is met every step
        f"model={tiny_model_dir}",
        f"run_dir={run_dir}",
    ]
    train_command(None, overrides, resume=None, progress=False)
    summary = capsys.readouterr().out
    assert main(["league", "show", str(run_dir), "--csv", str(tmp_path / "csv"), "--meta", "kuhn_poker"]) == 0
    out = capsys.readouterr().out
    assert "main: main@000000 -> main@000001 -> main@000002" in out
    with LeagueStore(RunDir(run_dir).league_store) as store:
        matches = store.matches()
    standings = {row["player"]: row for row in csv.DictReader((tmp_path / "csv" / "standings.csv").open())}
    # Every game the main player finished against another player is in its record.
    against_others = sum(1 for m in matches if len(set(m.players)) == 2)
    assert int(standings["main"]["games"]) == against_others
    assert {"main", "main@000000", "random"} <= set(standings)
    assert len(list(csv.DictReader((tmp_path / "csv" / "matches.csv").open()))) == len(matches)
    # The payoff matrix says that it pools games and seats, which payoff.csv keeps apart.
    assert "Payoffs, one table a game, seats pooled (payoff.csv, written by --csv DIR, keeps them apart)" in out
    payoff = list(csv.DictReader((tmp_path / "csv" / "payoff.csv").open()))
    assert {(row["game"], row["role"]) for row in payoff} >= {("tictactoe", "player_0"), ("kuhn_poker", "player_1")}
    # The snapshot taken after the last step has played no game: its Elo and win rate are blank, not NaN.
    unplayed = standings["main@000002"]
    assert (unplayed["games"], unplayed["elo"], unplayed["win_rate"]) == ("0", "", "")
    assert "nan" not in out.lower() and "nan" not in summary.lower()
    assert all("nan" not in path.read_text().lower() for path in (tmp_path / "csv").iterdir())
    # The latest policy is `main` in the meta-strategy as in the standings, not its checkpoint's name.
    meta = out[out.index("Meta-strategy") :]
    assert "main (the latest policy, step 2)" in meta and "main alone" in meta and "Nash mixture" in meta
    assert "\nmain " in meta and "step-000002" not in meta
    # The run ended with the same standings and the commands that look further.
    assert summary.startswith(f"\nRun {run_dir}: step 2 of 2. Its last step's games: mean reward ")
    assert "Standings after step 2" in summary and "\nrandom " in summary and "\nmain@000002 " in summary
    assert f"selfplay league show {run_dir} --meta kuhn_poker" in summary
    assert f"tensorboard --logdir {RunDir(run_dir).tensorboard}" in summary
    # Every player's rating reaches TensorBoard, the scripted `random`'s too, under the standings' names.
    events = EventAccumulator(str(RunDir(run_dir).tensorboard))
    events.Reload()
    rated = {tag.removeprefix("league/rating/") for tag in events.Tags()["scalars"] if tag.startswith("league/rating/")}
    assert rated == set(standings)
    assert [e.step for e in events.Scalars("league/rating/random")] == [1, 2]

    # Snapshots are candidates for `selfplay eval`, served with their own weights.
    snapshot = RunDir(run_dir).snapshot("main@000001")
    (candidate,) = find_candidates([str(snapshot)])
    assert (candidate.name, candidate.step, candidate.weights) == ("main@000001", 1, str(snapshot))
    served = candidate.policy("hf")
    assert served.version == 1
    assert all(torch.equal(served.model.state_dict()[k], v) for k, v in load_file(str(snapshot)).items())
    with pytest.raises(UserError, match="not a league snapshot"):
        find_candidates([str(tmp_path / "elsewhere@3.safetensors")])


def _decided(step: int, game: str, players: tuple[str, str], rewards: tuple[float, float]) -> LeagueMatch:
    return LeagueMatch(step, game, step, players, ("player_0", "player_1"), (step, step), rewards, "game_over")


def test_league_show_credits_a_restarted_exploiters_games_to_its_snapshot_ranks_the_unplayed_last_and_names_columns(
    tmp_path,
):
    """main_exploiter_0 restarted after step 2 (its snapshot main_exploiter_0@000002): its games of
    steps 1-2 are the snapshot's, those of step 3 its own. main@000003, taken after the last step,
    has played nothing: no rating, ranked last, whatever it inherited."""
    store = LeagueStore(RunDir(tmp_path).league_store)
    store.add_players(
        [
            LeaguePlayer("main", "main", 0),
            LeaguePlayer("main_exploiter_0", "main_exploiter", 0),
            LeaguePlayer("random", "scripted", 0),
        ]
    )
    won, lost = (1.0, -1.0), (-1.0, 1.0)
    store.record_step(
        1, [_decided(1, "kuhn_poker", ("main_exploiter_0", "main"), won)] * 20, ratings={"main": (20.0, 5.0)}
    )
    exploiter_snapshot = LeaguePlayer(
        "main_exploiter_0@000002", "snapshot", 2, "main_exploiter_0", "league/a.safetensors"
    )
    at_2 = {"main_exploiter_0@000002": (24.0, 6.0), "random": (10.0, 5.0)}
    store.record_step(2, [_decided(2, "tictactoe", ("main", "random"), won)] * 30, [exploiter_snapshot], ratings=at_2)
    latest = LeaguePlayer("main@000003", "snapshot", 3, "main", "league/b.safetensors")
    ratings = {"main": (20.0, 5.0), "main@000003": (30.0, 5.0), "main_exploiter_0": (25.0, 8.0)}
    store.record_step(3, [_decided(3, "kuhn_poker", ("main_exploiter_0", "main"), lost)] * 8, [latest], ratings=ratings)
    store.close()
    out = show(tmp_path, decay=1.0)
    rows = {line.split()[0]: line.split() for line in out.splitlines()[5:10]}
    assert list(rows) == ["main_exploiter_0", "main_exploiter_0@000002", "main", "random", "main@000003"]
    assert rows["main_exploiter_0@000002"][-3:] == ["20", "1.00", "20/0/0"]
    assert rows["main_exploiter_0"][-3:] == ["8", "0.00", "0/0/8"] and rows["main_exploiter_0"][2] == "25.0"
    # No game: no rating of its own, though it inherited 30.0; ranked after every player that played.
    assert rows["main@000003"][2:] == ["-", "-", "-", "0", "-", "0/0/0"]
    # Elo with its 95% interval; a whole loss or win leaves an end unbounded.
    assert re.search(r"\nmain_exploiter_0 +main_exploiter +25\.0 +8\.0 +\d+ \[-inf, \+\d+\] +8 ", out)
    assert re.search(r"\nmain +main +20\.0 +5\.0 +\d+ \[\+\d+, \+\d+\] +58 ", out)
    assert "Elo from fewer than 30 decided games is too uncertain to rank by: main_exploiter_0 (8), " in out
    assert "main@000003 (" not in out  # no game: no Elo to warn about
    # One payoff table a game, its columns named.
    kuhn = out[out.index("Payoff in kuhn_poker") : out.index("Payoff in tictactoe")]
    assert kuhn.splitlines()[1].split() == [
        "row",
        "vs",
        "column",
        "main",
        "main_exploiter_0",
        "main_exploiter_0@000002",
    ]
    assert "random" not in kuhn


def test_league_show_names_a_run_without_a_league_or_with_a_damaged_one(tmp_path, capsys):
    RunDir(tmp_path).config.write_text("steps: 1\n")
    assert main(["league", "show", str(tmp_path)]) == 2
    assert "holds no league" in capsys.readouterr().err
    # An empty store (a run stopped before creating it) stays as it is: showing it writes nothing.
    path = RunDir(tmp_path).league_store
    path.touch()
    assert main(["league", "show", str(tmp_path)]) == 2
    assert "empty: its run stopped before it created the league" in capsys.readouterr().err
    assert path.read_bytes() == b""
    path.unlink()
    with LeagueStore(path) as store:
        store.add_players([LeaguePlayer("main", "main", 0), LeaguePlayer("random", "scripted", 0)])
        store.record_step(1, [_match("main", "random", 1.0)])
        store._db.execute("UPDATE matches SET rewards = 'won'")
    assert main(["league", "show", str(tmp_path)]) == 2
    assert "is damaged: its match 1 (step 1) cannot be read" in capsys.readouterr().err


def test_role_games_train_in_the_league_with_role_slots(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    overrides = [
        "steps=1",
        "games={proposer_solver(attempts=2): 1, secret_keeping(rounds=1): 1}",
        "opponents={self: 1}",
        "rollout.games_per_step=4",
        "rollout.max_new_tokens=4",
        "league.enabled=true",
        "league.scripted=[random]",
        "league.role_opponents={defender: {random: 1}}",
        f"model={tiny_model_dir}",
        f"run_dir={run_dir}",
    ]
    metrics = train_command(None, overrides, resume=None, progress=False)
    assert "return/proposer_solver(attempts=2)/solver" in metrics
    with LeagueStore(RunDir(run_dir).league_store) as store:
        matches = store.matches()
    roles = {m.roles for m in matches}
    assert roles == {("proposer", "solver", "solver"), ("attacker", "defender")}
    # The learner alternates seats; a defender seat it leaves follows the defender's mix (random),
    # an attacker seat the main player's own (self).
    seated = {m.players for m in matches if m.roles == ("attacker", "defender")}
    assert seated == {("main", "random"), ("main", "main")}


@pytest.mark.slow
def test_exploiters_learn_at_league_exploiter_lr_and_the_main_player_at_learner_lr(tiny_model_dir, tmp_path):
    overrides = [*LEAGUE, "steps=1", "league.exploiter_lr=2e-3", f"model={tiny_model_dir}", f"run_dir={tmp_path}"]
    trainer = Trainer(load_config(None, overrides), progress=False)
    metrics = trainer.run()
    rates = {name: player.learner.optimizer.param_groups[0]["lr"] for name, player in trainer.roster.players.items()}
    assert rates == {"main": 1e-2, "main_exploiter_0": 2e-3, "league_exploiter_0": 2e-3}
    assert metrics["learner/lr"] == 1e-2 and metrics["main_exploiter_0/learner/lr"] == 2e-3


@pytest.mark.slow
def test_a_restarted_exploiter_warms_up_again_at_a_rate_the_run_schedule_does_not_decay(tiny_model_dir, tmp_path):
    overrides = [
        *LEAGUE,  # three steps, a snapshot (and an exploiter restart) after step 2
        "learner.lr_schedule=linear",
        "learner.warmup_steps=2",
        "learner.kl_coef=0.1",
        "league.exploiter_lr=2e-3",
        "league.exploiter_kl_coef=0",
        f"model={tiny_model_dir}",
        f"run_dir={tmp_path}",
    ]
    trainer = Trainer(load_config(None, overrides), progress=False)
    trainer.run()
    events = EventAccumulator(str(RunDir(tmp_path).tensorboard))
    events.Reload()
    rates = [[e.value for e in events.Scalars(tag)] for tag in ("learner/lr", "main_exploiter_0/learner/lr")]
    # main: warm-up over steps 1-2, then the linear decay's first step; the exploiter restarts
    # after step 2 and warms up again rather than taking the run's decayed rate.
    assert rates == [pytest.approx([5e-3, 1e-2, 1e-2]), pytest.approx([1e-3, 2e-3, 1e-3])]
    assert trainer.roster.players["main"].learner.config.kl_coef == 0.1
    assert {
        trainer.roster.players[name].learner.config.kl_coef for name in ("main_exploiter_0", "league_exploiter_0")
    } == {0}


@pytest.mark.slow
def test_exploiters_can_restart_from_the_main_players_weights(tiny_model_dir, tmp_path):
    overrides = [*LEAGUE, "steps=2", "league.exploiter_init=main", f"model={tiny_model_dir}", f"run_dir={tmp_path}"]
    with pytest.raises(UserError, match="exploiter_lora_rank=0"):
        load_config(None, overrides)
    trainer = Trainer(load_config(None, [*overrides, "league.exploiter_lora_rank=0"]), progress=False)
    initial = {k: v.clone() for k, v in trainer.roster.players["main"].learner.policy_state_dict().items()}
    trainer.run()  # both exploiters are frozen after step 2, and restart
    main = trainer.roster.players["main"].learner.policy_state_dict()
    assert any(not torch.equal(main[k], initial[k]) for k in main)
    for name in ("main_exploiter_0", "league_exploiter_0"):
        restarted = trainer.roster.players[name].learner.policy_state_dict()
        assert all(torch.equal(restarted[k], main[k]) for k in main)


def test_an_exploiter_hunts_the_main_snapshot_and_population_of_its_restart(tmp_path):
    config = load_config(
        None, ["games={kuhn_poker: 1}", "league.enabled=true", "league.main_exploiters=1", "league.league_exploiters=1"]
    )
    with LeagueStore(tmp_path / "league.sqlite") as store:
        store.add_players([*initial_players(config), _snapshot("main@000000")])
        # The league exploiter was frozen (and restarted) at step 2, beside the main player; the
        # main player alone again at step 3.
        store.record_step(
            2, [], [_snapshot("main@000002", step=2), _snapshot("league_exploiter_0@000002", "league_exploiter_0", 2)]
        )
        store.record_step(3, [], [_snapshot("main@000003", step=3)])
        league = League(config, store)
        main_exploiter, league_exploiter = league.players["main_exploiter_0"], league.players["league_exploiter_0"]
        assert league.hunted_main(main_exploiter) == "main@000000"  # not restarted since step 0
        assert league.pool(league_exploiter) == ["main@000000", "main@000002", "league_exploiter_0@000002"]
        assert league.pool(league.players["main"])[-1] == "main@000003"
        assert league.target_weights(main_exploiter) == {"main@000000": 1.0}
        # PFSP over a population it has not met yet: even odds.
        assert league.target_weights(league_exploiter) == pytest.approx(
            dict.fromkeys(league.pool(league_exploiter), 1 / 3)
        )
        # That population stays, but PFSP's weights over it follow the exploiter's results as it hunts.
        league.payoff.extend([_match("league_exploiter_0", "main@000000", 1.0, game="kuhn_poker")] * 4)
        assert league.target_weights(league_exploiter) == pytest.approx(
            {"main@000002": 0.5, "league_exploiter_0@000002": 0.5}
        )
        hunting = [m.players for m in league.schedule(4) if m.owner == "main_exploiter_0"]
        assert hunting and {name for players in hunting for name in players} == {"main_exploiter_0", "main@000000"}


EXPLOITER_STOP = [
    "steps=3",
    "games={kuhn_poker: 1}",
    "opponents={self: 0.5, pfsp:hard: 0.5}",
    "rollout.games_per_step=8",
    "rollout.max_new_tokens=12",
    "rollout.decoding=legal",
    "league.enabled=true",
    "league.main_exploiters=1",
    "league.exploiter_init=main",
    "league.exploiter_lora_rank=0",
    "league.exploiter_lr=1e-2",
    "league.exploiter_max_steps=2",
]


def _hunted(matches, exploiter: str) -> dict[int, set[str]]:
    """Whom `exploiter` met at each step, itself left out."""
    met: dict[int, set[str]] = {}
    for match in matches:
        if exploiter in match.players:
            met.setdefault(match.step, set()).update(set(match.players) - {exploiter})
    return met


@pytest.mark.slow
def test_a_main_exploiter_hunts_a_frozen_main_snapshot_until_the_exact_rule_or_the_cap_freezes_it(
    tiny_model_dir, tmp_path
):
    overrides = [
        *EXPLOITER_STOP,
        "league.exploiter_stop=exact",
        "league.exploiter_stop_fraction=0",  # any exploiter that does not lose to its target is done
        "league.exploiter_check_every=1",
        f"model={tiny_model_dir}",
        f"run_dir={tmp_path}",
    ]
    train_command(None, overrides, resume=None, progress=False)
    stops = read_stops(RunDir(tmp_path).exploiter_log)
    with LeagueStore(RunDir(tmp_path).league_store) as store:
        players = {p.name: p for p in store.players()}
        matches = store.matches()
    assert stops and [s["exploiter"] for s in stops] == ["main_exploiter_0"] * len(stops)
    target, restarted = "main@000000", 0
    met = _hunted(matches, "main_exploiter_0")
    for stop in stops:
        assert stop["target"] == {target: 1.0}
        # It met its target alone, all the while it trained; the target never moved.
        assert all(met[step] == {target} for step in range(restarted + 1, stop["step"] + 1))
        assert stop["steps"] == stop["step"] - restarted and stop["best_response_value"] > 0
        if stop["reason"] == "exact":
            assert stop["value"] >= 0
        else:
            assert stop["reason"] == "cap" and stop["steps"] == 2 and stop["value"] < 0
        assert players[stop["snapshot"]].parent == "main_exploiter_0"
        # The main player is frozen with it: the restarted exploiter's next target.
        target, restarted = f"main@{stop['step']:06d}", stop["step"]
        assert players[target].parent == "main"
    events = EventAccumulator(str(RunDir(tmp_path).tensorboard))
    events.Reload()
    assert len(events.Scalars("main_exploiter_0/exact/value")) == 3  # checked after every step
    frozen = events.Scalars("main_exploiter_0/stop/best_response_value")
    assert [(e.step, e.value) for e in frozen] == [(s["step"], pytest.approx(s["best_response_value"])) for s in stops]


# The exploiter's exact values at each step (a best response's is 1): its best is step 2's.
SCRIPTED_VALUES = {1: 0.1, 2: 0.3, 3: 0.2}


@pytest.mark.slow
def test_an_exploiter_is_frozen_with_its_best_checked_weights_and_pulled_to_its_restart_weights(
    tiny_model_dir, tmp_path, monkeypatch
):
    checked = Trainer._exact_checks
    weights_at: dict[int, dict[str, torch.Tensor]] = {}

    def scripted_checks(trainer):
        exploiter = trainer.roster.players["main_exploiter_0"].learner.model
        weights_at[trainer.step] = {name: t.detach().clone() for name, t in exploiter.state_dict().items()}
        return {name: ExactCheck(SCRIPTED_VALUES[trainer.step], 1.0) for name in checked(trainer)}

    monkeypatch.setattr(Trainer, "_exact_checks", scripted_checks)
    common = [
        *EXPLOITER_STOP,
        "league.exploiter_stop=exact",
        "league.exploiter_check_every=1",
        "league.exploiter_max_steps=3",
        "league.exploiter_keep_best=true",
        "league.exploiter_reference=start",
        "league.exploiter_kl_coef=0.1",
        "checkpoint_every=1",
        "keep_checkpoints=5",
        f"model={tiny_model_dir}",
    ]
    unbroken, broken = tmp_path / "unbroken", tmp_path / "broken"
    train_command(None, [*common, f"run_dir={unbroken}"], resume=None, progress=False)
    [stop] = read_stops(RunDir(unbroken).exploiter_log)
    # Frozen at the cap, with the weights and figures of its best check, step 2's, not its last.
    assert (stop["step"], stop["reason"], stop["value"], stop["best_response_value"]) == (3, "cap", 0.3, 1.0)
    frozen = load_file(str(unbroken / "league" / "snapshots" / "main_exploiter_0@000003.safetensors"))
    assert weights_at[2].keys() >= frozen.keys()
    assert all(torch.equal(frozen[name], weights_at[2][name]) for name in frozen)
    assert not all(torch.equal(frozen[name], weights_at[3][name]) for name in frozen)
    # Restarted from the main player's weights, its KL reference is moved to them, and saved.
    last = list_checkpoints(unbroken)[-1]
    restart = last / "exploiters" / "main_exploiter_0"
    reference, main_weights = (
        load_file(str(restart / "reference.safetensors")),
        load_file(str(last / "model.safetensors")),
    )
    shared = reference.keys() & main_weights.keys()  # a tied embedding is saved under one name or the other
    assert len(shared) >= len(main_weights) - 1
    assert all(torch.equal(reference[name], main_weights[name]) for name in shared)
    assert not (restart / "kept.safetensors").exists()  # a new exploiter has kept nothing yet

    # Resumed after step 2, the kept weights and their check come from the checkpoint.
    train_command(None, [*common, "steps=2", f"run_dir={broken}"], resume=None, progress=False)
    kept = list_checkpoints(broken)[-1] / "exploiters" / "main_exploiter_0"
    assert json.loads((kept / "trainer_state.json").read_text())["best_check"] == {
        "value": 0.3,
        "best_response_value": 1.0,
    }
    assert (kept / "kept.safetensors").exists()
    train_command(None, ["steps=3"], resume=str(broken), progress=False)
    assert read_stops(RunDir(broken).exploiter_log) == [stop]
    again = load_file(str(broken / "league" / "snapshots" / "main_exploiter_0@000003.safetensors"))
    assert all(torch.equal(again[name], frozen[name]) for name in frozen)


@pytest.mark.slow
def test_the_plateau_rule_freezes_an_exploiter_whose_score_against_its_target_stops_rising(tiny_model_dir, tmp_path):
    overrides = [
        *EXPLOITER_STOP,
        "league.exploiter_stop=plateau",
        "league.exploiter_plateau_games=4",
        "league.exploiter_plateau_gain=1",  # no block can gain a whole point: the first test stops it
        f"model={tiny_model_dir}",
        f"run_dir={tmp_path}",
    ]
    train_command(None, overrides, resume=None, progress=False)
    # Eight games a step against its target: two blocks of four after its first step.
    stops = read_stops(RunDir(tmp_path).exploiter_log)
    assert [(s["step"], s["reason"], s["games"]) for s in stops] == [
        (1, "plateau", 8),
        (2, "plateau", 8),
        (3, "plateau", 8),
    ]
    assert all(s["recent_block_score"] - s["previous_block_score"] < 1 and s["value"] is None for s in stops)


@pytest.mark.parametrize(
    "setting, refusal",
    [
        ("games={kuhn_poker: 1, leduc_holdem: 1}", "scores exploiters in one game"),
        ("games={tictactoe: 1}", "needs a best response: 'tictactoe' has more than 5000 information states"),
        ("league.main_exploiter_opponents={main: 1, random: 1}", "names random: drop them"),
        ("league.scripted=[random]", "league.scripted or league.role_opponents"),
    ],
)
def test_the_exact_rule_is_refused_where_no_best_response_is_computed(tiny_model_dir, tmp_path, setting, refusal):
    overrides = [
        *EXPLOITER_STOP,
        "league.exploiter_stop=exact",
        setting,
        f"model={tiny_model_dir}",
        f"run_dir={tmp_path}",
    ]
    with pytest.raises(UserError, match=refusal):
        Trainer(load_config(None, overrides), progress=False)
