"""The league store: exact round trips, all-or-nothing steps, rollback for a resumed run,
refusing files that are not league stores, and surviving kill -9 in the middle of writing."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from selfplay.errors import UserError
from selfplay.league.records import LeagueMatch, LeaguePlayer
from selfplay.league.store import SCHEMA_VERSION, LeagueStore

ROOT = Path(__file__).resolve().parents[1]
POPULATION = [
    LeaguePlayer("main", "main", 0),
    LeaguePlayer("league_exploiter_0", "league_exploiter", 0),
    LeaguePlayer("mcts:100", "scripted", 0),
]


def match(step: int, seed: int, players=("main", "mcts:100"), rewards=(1.0, -1.0)) -> LeagueMatch:
    return LeagueMatch(step, "tictactoe", seed, players, ("player_0", "player_1"), (step - 1, -1), rewards, "game_over")


def snapshot(step: int) -> LeaguePlayer:
    return LeaguePlayer(f"main@{step:06d}", "snapshot", step, parent="main", weights=f"snapshots/main@{step:06d}")


def content(store: LeagueStore) -> tuple:
    return store.players(), store.matches(), store.ratings(), store.last_step()


@pytest.fixture
def store(tmp_path):
    with LeagueStore(tmp_path / "league.sqlite") as store:
        store.add_players(POPULATION)
        yield store


def test_a_new_store_is_empty_at_step_0(tmp_path):
    with LeagueStore(tmp_path / "run" / "league.sqlite") as store:
        assert content(store) == ([], [], [], 0)
        assert store._db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_round_trip_is_exact_and_in_insertion_order(store):
    three_seats = LeagueMatch(
        1, "liars_dice", 2**40, ("mcts:100", "main", "league_exploiter_0"), ("b", "a", "c"), (-1, 0, 0),
        (-0.1, 0.30000000000000004, 1e-300), "turn_cap",
    )  # fmt: skip
    first = [match(1, 9), three_seats, match(1, 3, rewards=(0, 0))]
    store.record_step(1, first, ratings={"main": (26.5, 8.1), "mcts:100": (24, 7)})
    store.record_step(2, [match(2, 1)], new_players=[snapshot(2)], ratings={"main@000002": (26.5, 8.1)})
    store.record_step(3, [], retired=["league_exploiter_0"])

    assert store.players() == [
        *POPULATION[:1],
        LeaguePlayer("league_exploiter_0", "league_exploiter", 0, active=False),
        *POPULATION[2:],
        LeaguePlayer("main@000002", "snapshot", 2, parent="main", weights="snapshots/main@000002"),
    ]
    assert store.matches() == [*first, match(2, 1)]
    assert store.matches(since_step=2) == [match(2, 1)] == store.matches(2)
    assert store.matches(since_step=3) == []
    got = store.matches()[1]
    assert (type(got.players), type(got.versions[0]), type(got.rewards[2]), got.seed) == (tuple, int, float, 2**40)
    assert store.matches()[2].rewards == (0, 0) and type(store.matches()[2].rewards[0]) is int
    assert store.ratings() == [(1, "main", 26.5, 8.1), (1, "mcts:100", 24.0, 7.0), (2, "main@000002", 26.5, 8.1)]
    assert all(type(mu) is float and type(sigma) is float for _, _, mu, sigma in store.ratings())
    assert all(type(p.active) is bool for p in store.players())
    assert store.last_step() == 3


def test_reopening_gives_the_same_content(tmp_path):
    path = tmp_path / "league.sqlite"
    with LeagueStore(path) as store:
        store.add_players(POPULATION)
        store.record_step(1, [match(1, 0), match(1, 1)], new_players=[snapshot(1)], ratings={"main": (25.0, 8.0)})
        store.record_step(2, [match(2, 0)], retired=["main@000001"])
        before = content(store)
    with LeagueStore(path) as store:
        assert content(store) == before
        store.record_step(3, [match(3, 0)])  # and it is writable again
        assert store.last_step() == 3


def test_a_read_only_store_writes_nothing(tmp_path):
    path = tmp_path / "league.sqlite"
    with LeagueStore(path) as store:
        store.add_players(POPULATION)
        store.record_step(1, [match(1, 0)], new_players=[snapshot(1)], ratings={"main": (25.0, 8.0)})
        before = content(store)
    stored = path.read_bytes()
    with LeagueStore(path, read_only=True) as store:
        assert content(store) == before
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            store.rollback_to(0)
    # SQLite's shared-memory files of a WAL database may stay beside it, the log empty.
    assert path.read_bytes() == stored and (tmp_path / "league.sqlite-wal").read_bytes() == b""
    files = sorted(p.name for p in tmp_path.iterdir())

    # An empty file (a run stopped before it created its league) and a missing one are refused
    # as they are, where opening them to write would create a store.
    empty, missing = tmp_path / "empty.sqlite", tmp_path / "missing.sqlite"
    empty.touch()
    for path, reason in [(empty, "empty: its run stopped before it created the league"), (missing, "no such file")]:
        with pytest.raises(UserError, match=reason):
            LeagueStore(path, read_only=True)
    assert empty.read_bytes() == b"" and sorted(p.name for p in tmp_path.iterdir()) == sorted(["empty.sqlite", *files])


@pytest.mark.parametrize(
    "column, text", [("players", "main,mcts:100"), ("versions", "7"), ("rewards", "[1.0]")], ids=str
)
def test_a_damaged_match_row_is_named_with_the_fix(store, column, text):
    store.record_step(1, [match(1, 0), match(1, 1)])
    store._db.execute(f"UPDATE matches SET {column} = ? WHERE id = 2", (text,))
    with pytest.raises(UserError) as err:
        store.matches()
    assert f"The league store '{store.path}' is damaged: its match 2 (step 1) cannot be read" in str(err.value)
    assert f"sqlite3 '{store.path}' 'DELETE FROM matches WHERE id = 2'" in str(err.value)
    store._db.execute("DELETE FROM matches WHERE id = 2")  # the fix the message gives
    assert store.matches() == [match(1, 0)]


def test_a_duplicate_player_raises_and_adds_none_of_its_batch(store):
    with pytest.raises(ValueError, match="'main'"):
        store.add_players([LeaguePlayer("main_exploiter_0", "main_exploiter", 0), POPULATION[0]])
    with pytest.raises(ValueError, match="main_exploiter_0"):
        store.add_players([LeaguePlayer("main_exploiter_0", "main_exploiter", 0)] * 2)
    assert store.players() == POPULATION


@pytest.mark.parametrize(
    "bad_match, error",
    [
        (match(2, 5, players=("main", "nobody")), "'nobody' is not a league player"),
        (match(2, 5, rewards=(float("nan"), 1.0)), "Cannot store"),
        (match(1, 5), "A match of step 1 cannot be recorded with step 2"),
    ],
)
def test_a_step_that_fails_halfway_writes_nothing(store, bad_match, error):
    store.record_step(1, [match(1, 0)], new_players=[snapshot(1)], ratings={"main": (25.0, 8.0)})
    before = content(store)
    # The new player, the ratings and the first match are written before the bad match fails.
    with pytest.raises(ValueError, match=error):
        store.record_step(
            2, [match(2, 4, players=("main@000002", "main")), bad_match], new_players=[snapshot(2)],
            retired=["main@000001"], ratings={"main": (27.0, 7.5)},
        )  # fmt: skip
    assert content(store) == before
    store.record_step(2, [match(2, 4)], new_players=[snapshot(2)])  # the step can still be recorded
    assert store.last_step() == 2


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"ratings": {"ghost": (25.0, 8.0)}}, "'ghost' is not a league player"),
        ({"ratings": {"main": (float("nan"), 8.0)}}, "must be finite"),
        ({"retired": ["mcts:100", "mcts:100"]}, "Cannot retire 'mcts:100'"),
        ({"new_players": [snapshot(2), snapshot(2)]}, "Cannot add player 'main@000002'"),
        ({"new_players": [snapshot(3)]}, "created_step 3"),
    ],
)
def test_invalid_records_of_a_step_write_nothing(store, kwargs, error):
    store.record_step(1, [match(1, 0)])
    before = content(store)
    with pytest.raises(ValueError, match=error):
        store.record_step(2, [match(2, 0), match(2, 1)], **kwargs)
    assert content(store) == before


def test_a_step_is_recorded_once_until_rolled_back(store):
    store.record_step(1, [match(1, 0)])
    store.record_step(2, [match(2, 0)])
    with pytest.raises(ValueError, match=r"rollback_to\(1\)"):
        store.record_step(2, [match(2, 0)])
    assert store.matches() == [match(1, 0), match(2, 0)]


def test_rollback_forgets_later_steps_and_undoes_later_retirements(store):
    store.record_step(1, [match(1, 0)], new_players=[snapshot(1)], retired=["mcts:100"], ratings={"main": (25, 8)})
    after_1 = content(store)
    store.record_step(
        2, [match(2, 0), match(2, 1)], new_players=[snapshot(2)], retired=["league_exploiter_0", "main@000001"],
        ratings={"main": (26, 7), "main@000002": (26, 7)},
    )  # fmt: skip
    store.record_step(3, [match(3, 0, players=("main@000002", "main"))], retired=["main@000002"])
    store.record_step(4, [], new_players=[snapshot(4)])

    store.rollback_to(10)  # nothing after step 10: nothing changes, the last step stays
    assert store.last_step() == 4
    store.rollback_to(2)
    assert [m.step for m in store.matches()] == [1, 2, 2]
    assert {r[0] for r in store.ratings()} == {1, 2}
    assert [p.name for p in store.players()][-2:] == ["main@000001", "main@000002"]
    assert next(p for p in store.players() if p.name == "main@000002").active  # retired at step 3
    assert store.last_step() == 2

    store.rollback_to(1)
    assert content(store) == after_1
    assert not next(p for p in store.players() if p.name == "mcts:100").active  # retired at step 1 itself
    # A resumed run replays step 2 and records it again.
    store.record_step(2, [match(2, 7)], new_players=[snapshot(2)], retired=["main@000001"])
    assert store.matches(2) == [match(2, 7)]
    assert not store.players()[-2].active

    store.rollback_to(0)
    assert content(store) == (POPULATION, [], [], 0)


def test_files_that_are_not_league_stores_are_refused_and_left_untouched(tmp_path):
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"step,loss\n1,0.5\n" * 300)
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, note TEXT)")
        db.execute("INSERT INTO runs (note) VALUES ('keep me')")
    db.close()
    newer = tmp_path / "newer.sqlite"
    with LeagueStore(newer) as store:
        store.add_players(POPULATION)
    with sqlite3.connect(newer) as db:  # still in WAL mode, as a newer selfplay would leave it
        db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (SCHEMA_VERSION + 1,))
    db.close()
    damaged = tmp_path / "damaged.sqlite"
    damaged.write_bytes(b"SQLite format 3\x00" + b"\xff" * 5000)
    # Another program's databases with a `meta` table: one even says schema_version 1.
    foreign = tmp_path / "foreign.sqlite"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)")
        db.execute("INSERT INTO meta VALUES ('schema_version', 1)")
        db.execute("CREATE TABLE players (name TEXT)")
    db.close()
    other_meta = tmp_path / "other_meta.sqlite"
    with sqlite3.connect(other_meta) as db:
        db.execute("CREATE TABLE meta (name TEXT, data BLOB)")
    db.close()

    for path, reason in [
        (garbage, "not an SQLite database"),
        (other, "without the league tables"),
        (newer, f"schema version {SCHEMA_VERSION + 1}"),
        (damaged, "unreadable"),
        (foreign, "without the league tables"),
        (other_meta, "without the league tables"),
        (tmp_path, "not a file"),
    ]:
        files = {p: p.read_bytes() for p in tmp_path.iterdir()}
        for read_only in (False, True):
            with pytest.raises(UserError, match=reason) as err:
                LeagueStore(path, read_only=read_only)
            assert str(path) in str(err.value) and "Move it away" in str(err.value)
            assert {p: p.read_bytes() for p in files} == files


WRITER = """
import sys
from selfplay.league.records import LeagueMatch, LeaguePlayer
from selfplay.league.store import LeagueStore

store = LeagueStore(sys.argv[1])
if not store.players():
    store.add_players([LeaguePlayer("main", "main", 0), LeaguePlayer("mcts:100", "scripted", 0)])
step = store.last_step()
while True:
    step += 1
    matches = [
        LeagueMatch(step, "g", seed, ("main", "mcts:100"), ("p0", "p1"), (step, -1), (1.0, -1.0), "game_over")
        for seed in range(step % 5 + 1)
    ]
    snapshot = LeaguePlayer(f"main@{step}", "snapshot", step, parent="main", weights=f"w/{step}")
    retired = [f"main@{step - 2}"] if step > 2 else []
    store.record_step(step, matches, new_players=[snapshot], retired=retired, ratings={"main": (float(step), 1.0)})
    print(step, flush=True)
"""


def test_a_writer_killed_mid_step_leaves_whole_steps(tmp_path):
    path = tmp_path / "league.sqlite"
    reported: list[int] = []
    # Each writer resumes where the killed one stopped, so the store is reopened after every kill.
    for kill_after in (5, 40, 200):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        started = len(reported)
        for line in proc.stdout:
            reported.append(int(line))
            if len(reported) - started >= kill_after:
                break
        proc.kill()  # SIGKILL, wherever the writer is in its loop
        reported += [int(line) for line in proc.stdout]  # committed and printed before it died
        proc.wait()
        assert proc.returncode == -9

        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        db.close()
        with LeagueStore(path) as store:
            last = store.last_step()
            steps = range(1, last + 1)
            assert reported == sorted(set(reported)) and last >= reported[-1]
            # Every step up to the last committed one is whole; none after it is there at all.
            assert Counter(m.step for m in store.matches()) == {s: s % 5 + 1 for s in steps}
            assert [r[:3] for r in store.ratings()] == [(s, "main", float(s)) for s in steps]
            players = store.players()
            assert [p.name for p in players] == ["main", "mcts:100", *(f"main@{s}" for s in steps)]
            assert [p.name for p in players if not p.active] == [f"main@{s}" for s in range(1, last - 1)]
