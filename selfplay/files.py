"""Writing the files a run publishes so that no reader takes a half-written one for whole, and
so that a write that fails (a full disk) says so in one message.

A file another part reads as it is written (the weights a backend or a snapshot loads, the run's
config) is written under a `.partial` name beside it and renamed into place, so it is always
the old file or the new one; a write that fails removes the partial file and raises
`WriteError`: what was being written, the system's reason, and the free space on its disk. A
directory a user names for a command's output (`selfplay export`) is built beside it the same
way and published only onto nothing or an empty directory (`published_directory`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from safetensors import SafetensorError

from selfplay.errors import UserError

# What a write raises when it fails: safetensors reports a full disk as SafetensorError.
WRITE_FAILURES = (OSError, SafetensorError)
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
HASH_CHUNK_BYTES = 2**20


class WriteError(UserError):
    """A file could not be written, for `reason` (`disk_full`: for want of space); nothing
    half-written was left where a reader would take it for whole."""

    def __init__(self, message: str, reason: str, disk_full: bool = False):
        super().__init__(message)
        self.reason = reason
        self.disk_full = disk_full


def write_failure(what: str, path: str | Path, err: BaseException) -> WriteError:
    """The one message for a failed write of `what` at `path` (`err`: the write's error, or the
    WriteError of a file written as part of it)."""
    if isinstance(err, WriteError):
        reason, disk_full = err.reason, err.disk_full
    else:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        disk_full = is_disk_full(err)
    message = f"Could not write {what} '{path}': {reason} (the disk holding it has {free_gib(path):.2f} GiB free)."
    return WriteError(message, reason, disk_full)


def free_gib(path: str | Path) -> float:
    """The free space of the disk that holds `path` (or would, for a path not made yet), in GiB."""
    existing = next(p for p in [Path(path).absolute(), *Path(path).absolute().parents] if p.exists())
    return shutil.disk_usage(existing).free / 2**30


def is_disk_full(err: BaseException) -> bool:
    """Whether `err` is a write refused for want of space: the disk's, a quota's or SQLite's."""
    if isinstance(err, sqlite3.Error):
        return getattr(err, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
    if isinstance(err, SafetensorError):
        return "os error 28" in str(err)  # ENOSPC, as Rust reports it
    return isinstance(err, OSError) and err.errno in _DISK_FULL


@contextmanager
def published(path: str | Path, what: str) -> Iterator[Path]:
    """The partial path to write `path`'s new contents to; renamed to `path` when the block ends,
    removed if it raises. A failed write raises WriteError naming `what`."""
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    try:
        yield partial
        partial.replace(path)
    except BaseException as err:
        partial.unlink(missing_ok=True)
        if isinstance(err, WRITE_FAILURES):
            raise write_failure(what, path, err) from None
        raise


@contextmanager
def published_directory(path: str | Path, what: str) -> Iterator[Path]:
    """A new directory beside `path` to build its contents in, renamed to `path` when the block
    ends: in one step, and only onto nothing or an empty directory, so that no reader sees it
    half-made and nothing another process put at `path` meanwhile is lost. It is made as any new
    directory is (the umask says its permissions). A block that raises leaves nothing; a failed
    write raises WriteError naming `what`, and a `path` that is no longer empty UserError."""
    path = Path(path)
    scratch = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch.mkdir()
        yield scratch
        try:
            os.rename(scratch, path)  # replaces an empty directory, and nothing else
        except OSError as err:
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise
            raise UserError(
                f"'{path}' is no longer an empty directory (something was put there meanwhile): {what} was not "
                "written there. Choose a new directory."
            ) from None
    except BaseException as err:
        shutil.rmtree(scratch, ignore_errors=True)
        if isinstance(err, WRITE_FAILURES):
            raise write_failure(what, path, err) from None
        raise


def set_file_permissions_from_directory(directory: Path) -> None:
    """Give every file under `directory` the permissions a new file gets where the directory was
    made (its own, less execute: 0644 under the usual umask): safetensors writes its files 0600,
    which would leave a model's weights alone unreadable to the others who may read the rest."""
    mode = directory.stat().st_mode & 0o666
    for path in directory.rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(mode)


def replace_text(path: str | Path, text: str, what: str) -> None:
    """`path` now holds `text`, on disk, whole or not at all."""
    with published(path, what) as partial:
        _write(partial, text, "w")


def append_text(path: str | Path, text: str, what: str) -> None:
    """`text` added to the end of `path`, on disk before this returns. A reader of a line-based
    log passes over a last line that a crash cut short."""
    try:
        _write(Path(path), text, "a")
    except OSError as err:
        raise write_failure(what, path, err) from None


def read_json_lines(path: str | Path) -> list:
    """The JSON values of a log written one a line by `append_text`, in order; none if `path` does
    not exist. A line that is not a whole value (the last one of a run killed while writing it)
    is passed over."""
    path = Path(path)
    if not path.exists():
        return []
    values = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            values.append(json.loads(line))
        except ValueError:
            continue
    return values


def file_sha256(file: Path) -> str:
    """The SHA-256 of `file`, read a chunk at a time: model and checkpoint files run to gigabytes."""
    digest = hashlib.sha256()
    with open(file, "rb") as stream:
        for chunk in iter(lambda: stream.read(HASH_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _write(path: Path, text: str, mode: str) -> None:
    with path.open(mode, encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
