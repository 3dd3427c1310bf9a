"""The league's persistent store: its players, every match they finished, and their ratings.

One SQLite file (`RunDir.league_store`: `RUN_DIR/league.sqlite`) in write-ahead-logging mode. Everything a training
step changes is written by `record_step` in one transaction, so a run killed at any moment
leaves each step either wholly in the store or not at all. A run resumed from its checkpoint
at step S calls `rollback_to(S)` and records the later steps again as it replays them.

Tables: `players` (every `LeaguePlayer` field plus the step it was retired at), `matches`
(every `LeagueMatch` field, tuples as JSON text, in insertion order), `ratings` (step, player,
mu, sigma) and `meta` (the schema version and the last step `record_step` committed).
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from types import MappingProxyType

from selfplay.errors import UserError
from selfplay.league.records import LeagueMatch, LeaguePlayer

SCHEMA_VERSION = 1
_SQLITE_HEADER = b"SQLite format 3\x00"
_NO_RATINGS: Mapping[str, tuple[float, float]] = MappingProxyType({})

_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    """CREATE TABLE players (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL UNIQUE,
        kind TEXT NOT NULL,
        created_step INTEGER NOT NULL,
        parent TEXT,
        weights TEXT,
        active INTEGER NOT NULL CHECK (active IN (0, 1)),
        retired_step INTEGER
    )""",
    """CREATE TABLE matches (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        step INTEGER NOT NULL,
        game TEXT NOT NULL,
        seed INTEGER NOT NULL,
        players TEXT NOT NULL,
        roles TEXT NOT NULL,
        versions TEXT NOT NULL,
        rewards TEXT NOT NULL,
        end_reason TEXT NOT NULL
    )""",
    "CREATE INDEX matches_step ON matches (step)",
    """CREATE TABLE ratings (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        step INTEGER NOT NULL,
        player TEXT NOT NULL REFERENCES players (name),
        mu REAL NOT NULL,
        sigma REAL NOT NULL
    )""",
    "CREATE INDEX ratings_step ON ratings (step)",
)
_MATCH_COLUMNS = "step, game, seed, players, roles, versions, rewards, end_reason"


class LeagueStore:
    """The league store of one run. Opening a file that is not a league store raises `UserError`
    and leaves the file as it was. A `read_only` store never writes its file, and refuses one
    that holds no league yet instead of creating it."""

    def __init__(self, path: str | Path, read_only: bool = False):
        self.path = Path(path)
        self._db = _open(self.path, read_only)

    def add_players(self, players: Sequence[LeaguePlayer]) -> None:
        """Add players outside a step (the initial population); all or none. A name already in
        the league raises ValueError."""
        with self._transaction():
            self._insert_players(players, retired_step=None)

    def record_step(
        self,
        step: int,
        matches: Sequence[LeagueMatch],
        new_players: Sequence[LeaguePlayer] = (),
        retired: Sequence[str] = (),
        ratings: Mapping[str, tuple[float, float]] = _NO_RATINGS,
    ) -> None:
        """Everything training step `step` changed, in one transaction: the players it created
        (their `created_step` must be `step`), the matches it finished (their `step` must be
        `step`), the players it retired (made inactive as of `step`) and the ratings (name ->
        (mu, sigma)) as of `step`. `step` must come after the last recorded step: a replayed step
        needs `rollback_to` first. Matches and ratings must name players created by `step`.
        Anything invalid raises ValueError and writes nothing of the step."""
        for player in new_players:
            if player.created_step != step:
                raise ValueError(f"New player {player.name!r} of step {step} has created_step {player.created_step}.")
        with self._transaction():
            last = self.last_step()
            if step <= last:
                raise ValueError(
                    f"Step {step} is not after the league store's last step {last}; "
                    f"call rollback_to({step - 1}) before recording it again."
                )
            self._insert_players(new_players, retired_step=step)
            known = {name for (name,) in self._db.execute("SELECT name FROM players WHERE created_step <= ?", (step,))}
            for match in matches:
                if match.step != step:
                    raise ValueError(f"A match of step {match.step} cannot be recorded with step {step}: {match}")
                _require_known(match.players, known, step)
                self._db.execute(
                    f"INSERT INTO matches ({_MATCH_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", _match_row(match)
                )
            _require_known(ratings, known, step)
            rows = [(step, name, float(mu), float(sigma)) for name, (mu, sigma) in ratings.items()]
            if not all(math.isfinite(value) for row in rows for value in row[2:]):
                raise ValueError(f"The ratings of step {step} must be finite numbers: {dict(ratings)}")
            self._db.executemany("INSERT INTO ratings (step, player, mu, sigma) VALUES (?, ?, ?, ?)", rows)
            for name in retired:
                cursor = self._db.execute(
                    "UPDATE players SET active = 0, retired_step = ? "
                    "WHERE name = ? AND active = 1 AND created_step <= ?",
                    (step, name, step),
                )
                if cursor.rowcount != 1:
                    raise ValueError(f"Cannot retire {name!r} at step {step}: it is not an active league player.")
            self._db.execute("UPDATE meta SET value = ? WHERE key = 'last_step'", (step,))

    def players(self) -> list[LeaguePlayer]:
        """Every player, retired ones included, in the order they were added."""
        rows = self._db.execute("SELECT name, kind, created_step, parent, weights, active FROM players ORDER BY seq")
        return [LeaguePlayer(*row[:5], active=bool(row[5])) for row in rows]

    def matches(self, since_step: int = 0) -> list[LeagueMatch]:
        """The matches of steps `since_step` and later (all of them by default), in the order
        they were recorded."""
        rows = self._db.execute(f"SELECT id, {_MATCH_COLUMNS} FROM matches WHERE step >= ? ORDER BY id", (since_step,))
        return [self._match(row) for row in rows]

    def ratings(self) -> list[tuple[int, str, float, float]]:
        """Every recorded rating as (step, player, mu, sigma), in the order they were recorded."""
        return list(self._db.execute("SELECT step, player, mu, sigma FROM ratings ORDER BY id"))

    def last_step(self) -> int:
        """The last step `record_step` committed; 0 for a new store."""
        return self._db.execute("SELECT value FROM meta WHERE key = 'last_step'").fetchone()[0]

    def rollback_to(self, step: int) -> None:
        """Forget everything recorded after `step`: later matches, ratings and players, and later
        retirements (those players are active again). The last step becomes min(last, step)."""
        if step < 0:
            raise ValueError(f"Cannot roll the league store back to step {step}: steps start at 0.")
        with self._transaction():
            self._db.execute("DELETE FROM matches WHERE step > ?", (step,))
            # Before the players: a rating references its player.
            self._db.execute("DELETE FROM ratings WHERE step > ?", (step,))
            self._db.execute("DELETE FROM players WHERE created_step > ?", (step,))
            self._db.execute("UPDATE players SET active = 1, retired_step = NULL WHERE retired_step > ?", (step,))
            self._db.execute("UPDATE meta SET value = min(value, ?) WHERE key = 'last_step'", (step,))

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> LeagueStore:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        # IMMEDIATE takes the write lock up front, so a concurrent writer waits instead of
        # failing halfway through.
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:  # SQLite rolls some errors back by itself
                self._db.execute("ROLLBACK")
            raise

    def _match(self, row: tuple) -> LeagueMatch:
        """A match from its row (id first); a row no `record_step` could have written raises UserError."""
        row_id, step, game, seed, *seats, end_reason = row
        try:
            players, roles, versions, rewards = (tuple(json.loads(text)) for text in seats)
            if not len(players) == len(roles) == len(versions) == len(rewards) > 0:
                raise ValueError("its players, roles, versions and rewards differ in number")
        except (TypeError, ValueError) as err:
            raise UserError(
                f"The league store '{self.path}' is damaged: its match {row_id} (step {step}) cannot be read ({err}). "
                f"Restore the file from a copy, or delete that match: sqlite3 '{self.path}' "
                f"'DELETE FROM matches WHERE id = {row_id}'."
            ) from None
        return LeagueMatch(step, game, seed, players, roles, versions, rewards, end_reason)

    def _insert_players(self, players: Sequence[LeaguePlayer], retired_step: int | None) -> None:
        for p in players:
            try:
                self._db.execute(
                    "INSERT INTO players (name, kind, created_step, parent, weights, active, retired_step) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        p.name,
                        p.kind,
                        p.created_step,
                        p.parent,
                        p.weights,
                        int(p.active),
                        None if p.active else retired_step,
                    ),
                )
            except sqlite3.IntegrityError as err:
                raise ValueError(f"Cannot add player {p.name!r} to the league: {err}.") from None


def _open(path: Path, read_only: bool) -> sqlite3.Connection:
    """Connect to the store at `path`, creating it if the file is new or empty (unless
    `read_only`); only reads the file until it is known to be a league store."""
    if path.exists():
        if not path.is_file():
            raise _not_a_store(path, "not a file")
        with open(path, "rb") as f:
            header = f.read(len(_SQLITE_HEADER))
        if header and header != _SQLITE_HEADER:  # empty: a run killed while creating the store
            raise _not_a_store(path, "not an SQLite database")
    elif read_only:
        raise _not_a_store(path, "no such file")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
    # isolation_level=None: no implicit transactions; `_transaction` and the schema set-up say
    # where each one begins and ends.
    if read_only:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
    else:
        db = sqlite3.connect(path, isolation_level=None)
    try:
        try:
            version = _schema_version(db, path)
        except sqlite3.DatabaseError as err:  # e.g. an SQLite header on a damaged file
            raise _not_a_store(path, f"unreadable: {err}") from None
        if version is None:
            if read_only:
                raise _not_a_store(path, "empty: its run stopped before it created the league")
            db.execute("BEGIN IMMEDIATE")
            if _schema_version(db, path) is None:  # unless another process created it meanwhile
                for statement in _SCHEMA:
                    db.execute(statement)
                db.executemany(
                    "INSERT INTO meta (key, value) VALUES (?, ?)",
                    [("schema_version", SCHEMA_VERSION), ("last_step", 0)],
                )
            db.execute("COMMIT")
        elif version != SCHEMA_VERSION:
            raise _not_a_store(path, f"league store schema version {version}; this selfplay reads {SCHEMA_VERSION}")
        if not read_only:
            db.execute("PRAGMA journal_mode = WAL")
            # In WAL mode a commit is in the log file once COMMIT returns, so NORMAL (no fsync per
            # commit) loses nothing when the process is killed; only an OS crash or power cut may
            # drop the last few commits, and it never corrupts the file.
            db.execute("PRAGMA synchronous = NORMAL")
            db.execute("PRAGMA foreign_keys = ON")
    except BaseException:
        db.close()
        raise
    return db


def _schema_version(db: sqlite3.Connection, path: Path) -> int | None:
    """The store's schema version; None for an empty database. A database whose tables are not
    the league's (another program's, with a `meta` table of its own) raises UserError."""
    if db.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0] == 0:
        return None
    row = None
    if _columns(db, "meta") == _schema_tables()["meta"]:
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    # A newer schema may have other tables: its version is the clearer message.
    if row is None or (row[0] == SCHEMA_VERSION and any(_columns(db, t) != c for t, c in _schema_tables().items())):
        raise _not_a_store(path, "an SQLite database without the league tables")
    return row[0]


def _columns(db: sqlite3.Connection, table: str) -> tuple[str, ...]:
    """The column names of `table`; none if there is no such table."""
    return tuple(name for _, name, *_ in db.execute(f"PRAGMA table_info({table})"))


@cache
def _schema_tables() -> dict[str, tuple[str, ...]]:
    """Each table of the league schema and its columns, as SQLite creates them."""
    db = sqlite3.connect(":memory:")
    for statement in _SCHEMA:
        db.execute(statement)
    tables = db.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
    columns = {table: _columns(db, table) for (table,) in tables.fetchall()}
    db.close()
    return columns


def _not_a_store(path: Path, reason: str) -> UserError:
    return UserError(
        f"'{path}' is not a league store this version of selfplay can open ({reason}); it was left untouched. "
        "Move it away, or point at the run directory whose league store you meant."
    )


def _require_known(names: Iterable[str], known: set[str], step: int) -> None:
    for name in names:
        if name not in known:
            raise ValueError(f"{name!r} is not a league player at step {step}.")


def _match_row(match: LeagueMatch) -> tuple:
    try:
        # allow_nan=False: NaN and infinity are not JSON, and a reward should never be either.
        encoded = [json.dumps(v, allow_nan=False) for v in (match.players, match.roles, match.versions, match.rewards)]
    except (TypeError, ValueError) as err:
        raise ValueError(f"Cannot store {match}: {err}") from None
    return (match.step, match.game, match.seed, *encoded, match.end_reason)
