"""Run untrusted Python functions, as a proposer writes them, each in a throw-away sandbox.

In the code-reasoning game (after Absolute Zero) the model proposes a small deterministic function
and an input, and the framework runs them to get the output the solver must predict. Model output is
untrusted input: it must never crash or stall the trainer, touch a file of the machine's, reach the
network or start processes. The boundary is the operating system's: each run is a fresh interpreter
(`python -S -s -B`: no site-packages, in an environment of the sandbox's own) inside a bubblewrap
jail (`bubblewrap.py`: its own user, PID, network, mount and IPC namespaces, a read-only root holding
only the interpreter and the allowed standard library, an empty read-only working directory, a
seccomp filter, and the unprivileged uid 65534 even when the trainer runs as root). Within it:

- Kernel limits, set by the runner on itself before it reads the task: CPU time, address space and
  open descriptors as `SandboxLimits` says, and zero file size, core size and process count.
- A wall-clock timeout, after which the jail is killed with every process in it.
- Limits on what comes back, which hold where the trainer reads it: at most _MAX_PIPE_BYTES from
  each pipe, an output of at most MAX_OUTPUT_CHARS characters and an error cut to MAX_ERROR_CHARS,
  whatever the result line says (the task can write it itself). The runner keeps to them too,
  counting on a plain copy of the text, whatever a str subclass's methods say.
- Defence in depth, not the boundary (PEP 578 says audit hooks cannot be one): an audit hook the
  runner installs before the task is compiled, so that the first forbidden action ends the run with
  a specific error (a banned module, a file outside the working directory, a socket, a process, a
  signal, ctypes, bytecode, tracing, walking the heap, changing limits), and an `__import__` that
  refuses banned modules even when they are loaded already. Imports compile from source (no .pyc is
  read), so unmarshalling stays blockable.

Determinism. A run pins what the sandbox controls: the interpreter's hash seed (PYTHONHASHSEED; `-I`
would ignore it) and `random`'s seed are both the run's `seed`, and the jail gives the task the same
hostname, PIDs and working directory every time, no variable of the trainer's environment, and no
randomness from the kernel (getrandom is refused and there is no /dev/urandom). So run() gives the
same output every time for a task that reads no clock and no address. `verify()` runs the task under
each of SEEDS and accepts it only if the outputs are identical. That refuses, every time, output that
shows string hashes, addresses (id(), default reprs: address randomisation stays on so that they
differ), a sub-second clock, unseeded `random` or the operating system's randomness (an error in the
jail), and output that depends on the order of a set of strings, unless both seeds order that set
alike: about half the sets of two strings, a few in a hundred of three to five. It cannot catch what
two runs show alike: a coin flip that both seeds call the same way, an order of objects by address
(memory is laid out alike in both runs), a clock read to the hour or the day, or a task that differs
only on some later run. What it accepts, run() gives again under SEEDS[0] (a clock aside), so an
accepted task has one answer. `benchmarks/sandbox_determinism.py` counts what it accepts and refuses
of each kind of task. Unsafe isolation pins the seeds alone.

`isolation="unsafe"` runs the same runner without the jail, in a child process of the trainer's
user: the audit hook and limits alone, which a task written to attack them gets past (native code
raises no audit events). It exists for machines without user namespaces, and says what it is.
"""

from __future__ import annotations

import functools
import json
import math
import os
import select
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from selfplay.errors import UserError
from selfplay.roles import bubblewrap

ISOLATIONS = ("bubblewrap", "unsafe")
# The seeds of a run: the interpreter's hash seed and `random`'s. run() pins the first, so that a run is
# reproducible; verify() runs under each and refuses output that differs (see the module's docstring).
SEEDS = (0, 1)
# A longer repr of a function's result is an error: no solver needs to read that much.
MAX_OUTPUT_CHARS = 100_000
# An error is a reason, not data: longer ones are cut.
MAX_ERROR_CHARS = 300
# What the parent reads from each pipe before it gives up on the child: the result line with every
# character escaped (at most 12 bytes each), plus room for an interpreter error.
_MAX_PIPE_BYTES = 12 * MAX_OUTPUT_CHARS + 4096

BANNED_MODULES = (
    # the operating system, processes, threads and signals
    "os", "posix", "subprocess", "_posixsubprocess", "multiprocessing", "_multiprocessing", "concurrent",
    "pty", "signal", "_signal", "threading", "_thread", "resource", "fcntl", "mmap", "_posixshmem",
    # files, databases and C code that reads or writes them without an audit event
    "shutil", "sqlite3", "_sqlite3", "dbm", "shelve", "syslog", "readline", "pwd", "grp", "spwd", "ossaudiodev",
    "nis", "curses", "_curses", "tkinter", "_tkinter",
    # the network
    "socket", "_socket", "ssl", "_ssl", "asyncio", "_asyncio", "urllib", "http", "ftplib", "smtplib", "xmlrpc",
    "socketserver", "requests",
    # the interpreter's internals: ways around the hook or the guarded import
    "sys", "builtins", "importlib", "_imp", "zipimport", "runpy", "gc", "ctypes", "_ctypes", "pickle", "_pickle",
    "marshal", "pdb", "_xxsubinterpreters", "_xxinterpchannels", "_interpreters", "_interpchannels", "_interpqueues",
    "_testcapi", "_testinternalcapi",
)  # fmt: skip


@dataclass(frozen=True)
class SandboxLimits:
    cpu_seconds: float = 2.0  # RLIMIT_CPU, rounded up to whole seconds; SIGKILL follows a second later
    wall_seconds: float = 5.0  # then the jail is killed
    memory_mb: int = 256  # RLIMIT_AS
    open_files: int = 64  # RLIMIT_NOFILE
    banned_modules: tuple[str, ...] = BANNED_MODULES  # top-level names

    def __post_init__(self):
        if min(self.cpu_seconds, self.wall_seconds, self.memory_mb, self.open_files) <= 0:
            raise UserError(f"Sandbox limits must be positive, not {self}.")

    def arguments(self) -> list[str]:
        """The kernel limits as LIMITS_PRELUDE reads them from argv[1:4]."""
        return [str(math.ceil(self.cpu_seconds)), str(self.memory_mb * 2**20), str(self.open_files)]


@dataclass(frozen=True)
class SandboxResult:
    ok: bool
    output: str | None = None  # repr() of the function's return value when ok
    error: str | None = None  # why not ok, short and specific


DEFAULT_LIMITS = SandboxLimits()

# The first lines of every program run in the sandbox, with argv[1:4] the CPU seconds, address-space
# bytes and open descriptors: the limits go on before anything else runs, and cannot be raised again.
LIMITS_PRELUDE = r"""
import resource
import sys

for _which, _value in zip(("RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_NOFILE"), map(int, sys.argv[1:4])):
    resource.setrlimit(getattr(resource, _which), (_value, _value + 1 if _which == "RLIMIT_CPU" else _value))
for _which in ("RLIMIT_FSIZE", "RLIMIT_CORE", "RLIMIT_NPROC"):  # no bytes written, no core dumps, no new tasks
    resource.setrlimit(getattr(resource, _which), (0, 0))
"""

# The program the child runs. It imports only what it needs before the hook goes in, so that nothing
# dangerous is loaded already when the task starts; it is a string because the child cannot import
# this package (`-S -s` leaves site-packages off its path).
_RUNNER = (
    LIMITS_PRELUDE
    + r'''
# importlib.machinery and threading are not used here: they are loaded now so that allowed modules that
# import them (dataclasses, queue, logging) still work, as loading a banned module later is refused.
import ast
import importlib.machinery  # noqa: F401
import json
import os
import random
import threading  # noqa: F401
import time
from json.encoder import encode_basestring_ascii  # the C encoder: the task cannot patch it

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
DEVICE_TYPES = (0o020000, 0o060000)  # S_IFCHR, S_IFBLK
# event: (argument positions of paths, of directory descriptors), for events that change files
CHANGES = {
    "os.remove": ((0,), (1,)),
    "os.rmdir": ((0,), (1,)),
    "os.mkdir": ((0,), (2,)),
    "os.rename": ((0, 1), (2, 3)),
    "os.link": ((0, 1), (2, 3)),
    "os.truncate": ((0,), ()),
    "os.chmod": ((0,), (2,)),
    "os.chown": ((0,), (3,)),
    "os.utime": ((0,), (3,)),
    "os.setxattr": ((0,), ()),
    "os.removexattr": ((0,), ()),
    "os.chflags": ((0,), ()),
    "os.lchflags": ((0,), ()),
    "sqlite3.connect": ((0,), ()),
}
BLOCKED = {
    event: message
    for message, events in {
        "blocked: starting a process": [
            "os.exec", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen",
            "os.startfile",
        ],
        "blocked: creating a symbolic link": ["os.symlink"],
        "blocked: changing the working directory": ["os.chdir"],
        "blocked: sending a signal": ["os.kill", "os.killpg", "signal.pthread_kill"],
        "blocked: building or loading bytecode": ["code.__new__", "marshal.loads", "marshal.load"],
        "blocked: tracing": ["sys.settrace", "sys.setprofile", "sys.monitoring.register_callback"],
        "blocked: walking the heap": ["gc.get_objects", "gc.get_referrers", "gc.get_referents"],
        "blocked: changing resource limits": ["resource.setrlimit", "resource.prlimit"],
        "blocked: starting a subinterpreter": ["cpython.PyInterpreterState_New"],
        "blocked: loading a native extension": ["sqlite3.enable_load_extension"],
    }.items()
    for event in events
}


def reporter(
    fd,
    started,
    limits,
    write=os.write,
    exit=os._exit,
    quote=encode_basestring_ascii,
    clock=time.perf_counter,
    plain=str.__str__,
    length=len,
):
    """The one way the run ends: a JSON line on the result pipe, with the seconds since the task started
    (`started[0]`), then exit without running any of the task's cleanup. An output longer than
    `limits[0]` characters becomes an error, and an error is cut to `limits[1]`, as counted on a plain
    str copy of the text, so that a str subclass's own __len__, __getitem__ or __str__ decides nothing.
    Bound to builtin functions now, so the task cannot patch it; the parent checks the limits again."""
    max_output, max_error = limits

    def report(ok, text):
        text = plain(text)
        if ok and length(text) > max_output:
            ok, text = False, f"output too long ({length(text)} characters)"
        if not ok and length(text) > max_error:
            text = text[: max_error - 3] + "..."
        key = "output" if ok else "error"
        seconds = clock() - started[0] if started[0] else 0.0
        verdict = "true" if ok else "false"
        write(fd, f'{{"ok": {verdict}, "{key}": {quote(text)}, "seconds": {seconds!r}}}\n'.encode())
        exit(0)

    return report


def make_hook(report, workdir, readable, banned):
    """The audit hook. It binds every function it calls here: the task can rebind module attributes and
    builtins, but not these closure variables."""
    getcwd, lstat, oserror, type_, int_, str_, bytes_ = os.getcwd, os.lstat, OSError, type, int, str, bytes

    def block(message):
        report(False, message)

    def absolute(path):
        # Textual normalisation is exact here: no symbolic links can be made inside the working
        # directory, and the working directory cannot change.
        if type_(path) is bytes_:
            path = path.decode("utf-8", "surrogateescape")
        if not path.startswith("/"):
            path = getcwd() + "/" + path
        parts = []
        for part in path.split("/"):
            if part == "..":
                if parts:
                    parts.pop()
            elif part and part != ".":
                parts.append(part)
        return "/" + "/".join(parts)

    def within(path, roots):
        for root in roots:
            if path == root or path.startswith(root + "/"):
                return True
        return False

    def check(path, writing):
        if type_(path) is not str_ and type_(path) is not bytes_:
            block("blocked: a file path that is not a string")
        path = absolute(path)
        if within(path, (workdir,)):
            try:
                if lstat(path).st_mode & 0o170000 in DEVICE_TYPES:
                    block("blocked: a device file")
            except oserror:
                pass
        elif writing:
            block("blocked: writing outside the working directory")
        elif not within(path, readable):
            block("blocked: reading outside the working directory")

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            if type_(path) is int_:
                return  # an open descriptor, checked when it was opened
            writing = type_(flags) is not int_ or flags & WRITE_FLAGS
            check(path, writing)
            # os.open (mode None) takes a dir_fd that the event does not show: a relative path could be anywhere
            if writing and mode is None and path[:1] not in ("/", b"/"):
                block("blocked: os.open for writing with a relative path")
        elif event in ("os.listdir", "os.scandir"):
            if type_(args[0]) is str_ or type_(args[0]) is bytes_:
                check(args[0], False)
        elif event in CHANGES:
            paths, dir_fds = CHANGES[event]
            for i in dir_fds:
                if args[i] is not None and args[i] != -1:
                    block("blocked: a path relative to a directory descriptor")
            for i in paths:
                if type_(args[i]) is int_:
                    block("blocked: changing a file by descriptor")
                check(args[i], True)
        elif event == "import":
            # str's own methods: a str subclass passed to __import__ could override them
            name = str_.partition(str_.__str__(args[0]), ".")[0]
            if name in banned:
                block(f"banned module '{name}'")
        elif event.startswith("socket."):
            block("blocked: network")
        elif event.startswith("ctypes."):
            block("blocked: ctypes")
        elif event == "object.__setattr__" and (type_(args[1]) is not str_ or args[1] == "__code__"):
            block("blocked: replacing a function's code")
        elif event in BLOCKED:
            block(BLOCKED[event])

    return hook


def make_import(report, banned, real_import=__import__, isinstance_=isinstance, str_=str):
    """The task's __import__: refuses banned modules even when they are loaded already."""

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
        if isinstance_(name, str_):
            name = str_.__str__(name)  # a plain str: a subclass could fake its hash and comparisons
            top = str_.partition(name, ".")[0]
            if level == 0 and top in banned:
                report(False, f"banned module '{top}'")
        return real_import(name, globals, locals, fromlist, level)

    return guarded_import


def describe(err):
    """The task's exception in a line, as long as it makes it: report() cuts it."""
    try:  # the task's own exception may fail to print
        if isinstance(err, MemoryError):
            return "memory limit"
        if isinstance(err, OSError) and err.errno in (27, 30):  # EFBIG (RLIMIT_FSIZE 0; SIGXFSZ is ignored), EROFS
            return "blocked: writing files"
        if isinstance(err, SyntaxError):
            return f"{type(err).__name__}: {err.msg} (line {err.lineno})"
        return f"{type(err).__name__}: {err}"
    except BaseException:
        return type(err).__name__


def main():
    task = json.loads(sys.stdin.buffer.read())
    started = [0.0]
    report = reporter(os.dup(1), started, task["limits"])
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the task's prints and stray writes go nowhere; the result has its own pipe
        os.dup2(devnull, fd)
    workdir = os.getcwd()
    # No .pyc is read (modules compile from source), so marshal.loads can be refused to the task.
    sys.dont_write_bytecode = True
    sys.pycache_prefix = workdir + "/.no-pycache"
    banned = frozenset(task["banned"])
    random.seed(task["seed"])  # as the interpreter's hash seed is: pinned for this run
    builtins = dict(vars(__builtins__))
    builtins["__import__"] = make_import(report, banned)
    namespace = {"__builtins__": builtins, "__name__": "__task__"}
    reserve = bytearray(1 << 20)  # freed on MemoryError so that the report itself has memory
    readable = tuple(path for path in sys.path if path.startswith("/"))
    sys.addaudithook(make_hook(report, workdir, readable, banned))
    started[0] = time.perf_counter()
    try:
        try:
            argument = ast.literal_eval(task["argument"])
        except Exception:
            report(False, "argument is not a Python literal")
        exec(compile(task["source"], "<task>", "exec"), namespace)
        function = namespace.get(task["function"])
        if function is None:
            report(False, f"NameError: function '{task['function']}' is not defined")
        if not callable(function):
            report(False, f"TypeError: '{task['function']}' is not callable")
        output = repr(function(argument))
    except BaseException as err:
        del reserve
        namespace.clear()
        report(False, describe(err))
    report(True, output)


main()
'''
)


class Sandbox:
    """Runs functions under one set of limits and one isolation, and counts its runs' cost for
    TensorBoard (`metrics`). Safe to share between threads."""

    def __init__(self, limits: SandboxLimits = DEFAULT_LIMITS, isolation: str = "bubblewrap"):
        if isolation not in ISOLATIONS:
            raise UserError(f"Unknown sandbox isolation '{isolation}'; choose one of {', '.join(ISOLATIONS)}.")
        self.limits = limits
        self.isolation = isolation
        # Built (and checked to work) now, so that a machine without bubblewrap fails before training.
        self.jail = bubblewrap.jail(frozenset(limits.banned_modules)) if isolation == "bubblewrap" else None
        self._lock = threading.Lock()
        self._runs = self._timed_runs = 0
        self._seconds = self._overhead = 0.0

    def run(self, source: str, function: str, argument: str, seed: int = SEEDS[0]) -> SandboxResult:
        """Define `source` (Python code), call `function` on the value of `argument` (a Python literal,
        parsed with ast.literal_eval inside the sandbox; a tuple literal is NOT unpacked: the function
        takes one argument), and return repr(result). `seed` is the interpreter's hash seed and
        `random`'s. Never raises for anything the code does."""
        task = json.dumps(
            {
                "source": source,
                "function": function,
                "argument": argument,
                "banned": list(self.limits.banned_modules),
                "limits": [MAX_OUTPUT_CHARS, MAX_ERROR_CHARS],
                "seed": seed,
            }
        ).encode()
        started = time.perf_counter()
        returncode, stdout, stderr, cut = self._execute(task, seed)
        result, task_seconds = _result(returncode, stdout, stderr, cut, self.limits, jailed=self.jail is not None)
        elapsed = time.perf_counter() - started
        with self._lock:
            self._runs += 1
            self._seconds += elapsed
            if task_seconds is not None and 0.0 <= task_seconds <= elapsed:  # the task can forge its time too
                self._timed_runs += 1
                self._overhead += max(0.0, elapsed - task_seconds)
        return result

    def verify(self, source: str, function: str, argument: str) -> SandboxResult:
        """run() under each of SEEDS; ok only if every run gave the same output, which is then what run()
        gives (else the first failure, or the error "output is not deterministic")."""
        first = self.run(source, function, argument, SEEDS[0])
        if not first.ok:
            return first
        for seed in SEEDS[1:]:
            again = self.run(source, function, argument, seed)
            if not again.ok:
                return again
            if again.output != first.output:
                return SandboxResult(False, error="output is not deterministic")
        return first

    def verify_many(self, tasks: Sequence[tuple[str, str, str]], workers: int = 16) -> list[SandboxResult]:
        """verify() for many (source, function, argument) tasks concurrently (a thread pool; each run is its
        own jail), results in order."""
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(lambda task: self.verify(*task), tasks))

    def metrics(self) -> dict[str, float]:
        """Runs since the last call, their mean wall time, and the mean time spent starting and ending
        the sandbox rather than in the task, over the runs that reported their task's time (ms)."""
        with self._lock:
            runs, timed, seconds, overhead = self._runs, self._timed_runs, self._seconds, self._overhead
            self._runs = self._timed_runs = 0
            self._seconds = self._overhead = 0.0
        metrics = {"sandbox/runs": float(runs), "sandbox/run_ms": 1e3 * seconds / runs} if runs else {}
        if timed:
            metrics["sandbox/start_ms"] = 1e3 * overhead / timed
        return metrics

    def _execute(self, task: bytes, seed: int) -> tuple[int, bytes, bytes, str | None]:
        """Start the runner, jailed (or, unsafe, in a temporary working directory), and talk to it."""
        limits = self.limits.arguments()
        if self.jail is None:
            with tempfile.TemporaryDirectory(prefix="sandbox-", ignore_cleanup_errors=True) as workdir:
                command = [sys.executable, *bubblewrap.PYTHON_FLAGS, "-c", _RUNNER, *limits]
                environment = {"PATH": "/usr/bin:/bin", **bubblewrap.python_environment(seed)}
                return self._talk(command, task, cwd=workdir, env=environment)
        seccomp_fd = bubblewrap.seccomp_descriptor(self.jail)
        try:
            command = self.jail.command(_RUNNER, limits, seccomp_fd, seed)
            return self._talk(command, task, pass_fds=(seccomp_fd,), **bubblewrap.spawn_options(self.jail))
        finally:
            os.close(seccomp_fd)

    def _talk(self, command: list[str], task: bytes, **options) -> tuple[int, bytes, bytes, str | None]:
        """Hand the task to the started runner and collect what it writes until it exits or the wall
        clock runs out; then kill whatever is left of it."""
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        with subprocess.Popen(command, start_new_session=True, **pipes, **options) as proc:
            deadline = time.monotonic() + self.limits.wall_seconds
            try:
                stdout, stderr, cut = _exchange(proc, task, deadline)
                if cut is None:
                    proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:  # it closed its pipes but kept running
                stdout, stderr, cut = b"", b"", "timeout"
            finally:
                # The whole session: bwrap and, through --die-with-parent, its PID namespace.
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        return proc.returncode, stdout, stderr, cut


@functools.cache
def shared_sandbox(isolation: str) -> Sandbox:
    """The process's sandbox with the default limits under `isolation`: one set of figures for every
    game that runs code."""
    return Sandbox(DEFAULT_LIMITS, isolation)


def _exchange(proc: subprocess.Popen, task: bytes, deadline: float) -> tuple[bytes, bytes, str | None]:
    """Send the task and read stdout and stderr until the child closes them. Returns both and why the
    exchange was cut short ("timeout", "too much output") or None."""
    pending = memoryview(task)
    received = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdin, selectors.EVENT_WRITE)
        for pipe in received:
            selector.register(pipe, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return bytes(received[proc.stdout]), bytes(received[proc.stderr]), "timeout"
            for key, _ in selector.select(remaining):
                if key.fileobj is proc.stdin:
                    try:  # PIPE_BUF bytes never block a pipe that select() calls writable
                        pending = pending[os.write(key.fd, pending[: select.PIPE_BUF]) :]
                    except BrokenPipeError:  # it died before reading its task
                        pending = pending[:0]
                    if not pending:
                        selector.unregister(proc.stdin)
                        proc.stdin.close()
                    continue
                chunk = os.read(key.fd, 2**16)
                if not chunk:
                    selector.unregister(key.fileobj)
                elif len(received[key.fileobj]) + len(chunk) > _MAX_PIPE_BYTES:
                    return bytes(received[proc.stdout]), bytes(received[proc.stderr]), "too much output"
                else:
                    received[key.fileobj] += chunk
    return bytes(received[proc.stdout]), bytes(received[proc.stderr]), None


def _result(
    returncode: int, stdout: bytes, stderr: bytes, cut: str | None, limits: SandboxLimits, jailed: bool
) -> tuple[SandboxResult, float | None]:
    """The run's result, and the seconds the task itself ran by the runner's clock (None when it did
    not say)."""
    if cut == "timeout":
        return SandboxResult(False, error=f"timed out after {limits.wall_seconds} s"), None
    if cut is not None:
        return SandboxResult(False, error="output too long"), None
    # bwrap exits with 128 + N when what it ran was killed by signal N.
    signalled = -returncode if returncode < 0 else returncode - 128 if jailed and returncode > 128 else 0
    if signalled:
        return SandboxResult(False, error=_signal_error(signalled)), None
    try:
        record = json.loads(stdout.splitlines()[-1])
    except (IndexError, ValueError, RecursionError):  # no line, or one the task wrote to be unreadable
        record = None
    if isinstance(record, dict) and returncode == 0:
        seconds = record.get("seconds") if isinstance(record.get("seconds"), float) else None
        output, error = record.get("output"), record.get("error")
        # The runner keeps to the limits, but the task can write this line itself: they hold on what was read.
        if record.get("ok") is True and isinstance(output, str):
            if len(output) > MAX_OUTPUT_CHARS:
                return SandboxResult(False, error=f"output too long ({len(output)} characters)"), seconds
            return SandboxResult(True, output=output), seconds
        if record.get("ok") is False and isinstance(error, str):
            return SandboxResult(False, error=_clipped(error)), seconds
    detail = stderr.decode(errors="replace").strip().splitlines()[-1:]
    error = ": ".join([f"no result from the sandbox (exit status {returncode})", *detail])
    return SandboxResult(False, error=_clipped(error)), None


def _clipped(error: str) -> str:
    return error if len(error) <= MAX_ERROR_CHARS else error[: MAX_ERROR_CHARS - 3] + "..."


def _signal_error(number: int) -> str:
    if number == signal.SIGXCPU:
        return "CPU time limit"
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    if number == signal.SIGKILL:
        return f"killed by {name} (CPU time or memory limit)"
    return f"killed by {name}"
