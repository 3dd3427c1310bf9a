"""Run untrusted Python functions, as a proposer writes them, in throw-away child processes.

In the code-reasoning game (after Absolute Zero) the model proposes a small deterministic function
and an input, and the framework runs them to get the output the solver must predict. Model output is
untrusted input: it must never crash or stall the trainer, touch the filesystem outside a throw-away
directory, reach the network or start processes. Each run is therefore a fresh interpreter,
`python -I -S` (no PYTHON* variables, no user or site packages: the task can import only the
standard library), with a minimal environment and a fresh temporary directory as working directory,
in a new session so that its whole process group can be killed. On top of that:

- Kernel limits on CPU time, address space, file size and core dumps, plus RLIMIT_NPROC when no child
  processes are allowed (the kernel ignores it for root). The parent sets them with `resource.prlimit`
  before it sends the task, so nothing untrusted runs without them. (Not in a `preexec_fn`: that is
  unsafe in a threaded parent, as the trainer and `verify_many` are, and makes `subprocess` fork the
  whole trainer instead of using vfork.)
- A wall-clock timeout, after which the process group is killed.
- Inside the child, an audit hook (PEP 578), installed after the runner has imported what it needs and
  before the task is compiled. The first forbidden action ends the run with a specific error: writing
  outside the working directory, reading outside it and the standard library, any socket, starting a
  process, sending a signal, ctypes, building or unmarshalling bytecode, replacing a function's code,
  walking the heap, tracing, changing limits, a subinterpreter, or loading a banned module. Imports
  compile from source (no .pyc is read), so unmarshalling stays blockable.
- Banned modules: the task's own imports of them are refused even when the module is already loaded
  (its `__import__` is guarded), and loading one for the first time is refused whoever asks. `os` and
  `sys` are banned outright rather than offered as a "safe subset": pure functions do not need them,
  and a subset would be one more thing to audit. `threading` and `importlib.machinery` are loaded by
  the runner so that allowed modules that import them (queue, logging, dataclasses) still work.

Known gaps, all needing a task written to attack this sandbox: CPython lets code reach any loaded
module through object introspection, and a few calls raise no audit event. With them a task running
as the trainer's user could write a fake result to the result pipe, start threads, or signal the
trainer through `_signal.pidfd_send_signal`; as root it could also create device files (`mknod`).
Against an adversarial model, run the trainer as a non-root user and the sandbox as another one, or
inside an OS sandbox (nsjail, bubblewrap, a seccomp filter).
"""

from __future__ import annotations

import json
import math
import os
import resource
import select
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from selfplay.errors import UserError

# A longer repr of a function's result is an error: no solver needs to read that much.
MAX_OUTPUT_CHARS = 100_000
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
    wall_seconds: float = 5.0  # then the process group is killed
    memory_mb: int = 256  # RLIMIT_AS
    file_size_kb: int = 64  # RLIMIT_FSIZE
    processes: int = 0  # child processes the task may start; more than 0 also needs them unbanned
    banned_modules: tuple[str, ...] = BANNED_MODULES  # top-level names

    def __post_init__(self):
        if min(self.cpu_seconds, self.wall_seconds, self.memory_mb, self.file_size_kb) <= 0 or self.processes < 0:
            raise UserError(f"Sandbox limits must be positive (processes at least 0), not {self}.")


@dataclass(frozen=True)
class SandboxResult:
    ok: bool
    output: str | None = None  # repr() of the function's return value when ok
    error: str | None = None  # why not ok, short and specific


DEFAULT_LIMITS = SandboxLimits()

# The program the child runs. It imports only what it needs before the hook goes in, so that nothing
# dangerous is loaded already when the task starts; it is a string because the child cannot import
# this package (`-I -S` leaves site-packages off its path).
_RUNNER = r'''
# importlib.machinery and threading are not used here: they are loaded now so that allowed modules that
# import them (dataclasses, queue, logging) still work, as loading a banned module later is refused.
import ast
import importlib.machinery  # noqa: F401
import json
import os
import sys
import threading  # noqa: F401
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
PROCESSES = {"os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen", "os.startfile"}
BLOCKED = {
    event: message
    for message, events in {
        "blocked: starting a process": ["os.exec"],
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


def reporter(fd, write=os.write, exit=os._exit, quote=encode_basestring_ascii):
    """The one way the run ends: a JSON line on the result pipe, then exit without running any of the
    task's cleanup. Bound to builtin functions now, so the task cannot patch it."""

    def report(ok, text):
        key = "output" if ok else "error"
        write(fd, f'{{"ok": {"true" if ok else "false"}, "{key}": {quote(text)}}}\n'.encode())
        exit(0)

    return report


def make_hook(report, workdir, readable, banned, processes):
    """The audit hook. It binds every function it calls here: the task can rebind module attributes and
    builtins, but not these closure variables."""
    getcwd, lstat, oserror, type_, int_, str_, bytes_ = os.getcwd, os.lstat, OSError, type, int, str, bytes
    started = [0]

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
        elif event in PROCESSES:
            started[0] += 1
            if started[0] > processes:
                block("blocked: starting a process")
        elif event.startswith("socket."):
            block("blocked: network")
        elif event.startswith("ctypes."):
            block("blocked: ctypes")
        elif event == "object.__setattr__" and (type_(args[1]) is not str_ or args[1] == "__code__"):
            block("blocked: replacing a function's code")
        elif event in BLOCKED and not (event == "os.exec" and processes):
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
    if isinstance(err, MemoryError):
        return "memory limit"
    if isinstance(err, OSError) and err.errno == 27:  # EFBIG: past RLIMIT_FSIZE (Python ignores SIGXFSZ)
        return "file size limit"
    if isinstance(err, SyntaxError):
        return f"{type(err).__name__}: {err.msg} (line {err.lineno})"
    try:  # the task's own exception may fail to print
        text = f"{type(err).__name__}: {err}"
    except BaseException:
        text = type(err).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def main():
    task = json.loads(sys.stdin.buffer.read())
    report = reporter(os.dup(1))
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the task's prints and stray writes go nowhere; the result has its own pipe
        os.dup2(devnull, fd)
    workdir = os.getcwd()
    # No .pyc is read (modules compile from source), so marshal.loads can be refused to the task.
    sys.dont_write_bytecode = True
    sys.pycache_prefix = workdir + "/.no-pycache"
    banned = frozenset(task["banned"])
    builtins = dict(vars(__builtins__))
    builtins["__import__"] = make_import(report, banned)
    namespace = {"__builtins__": builtins, "__name__": "__task__"}
    reserve = bytearray(1 << 20)  # freed on MemoryError so that the report itself has memory
    readable = tuple(path for path in sys.path if path.startswith("/"))
    sys.addaudithook(make_hook(report, workdir, readable, banned, task["processes"]))
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
    if len(output) > task["max_output"]:
        report(False, f"output too long ({len(output)} characters)")
    report(True, output)


main()
'''

# Environment of the child: no variables of the trainer's (tokens, proxies) leak into it.
_ENV = {"PATH": "/usr/bin:/bin"}


def run_function(source: str, function: str, argument: str, limits: SandboxLimits = DEFAULT_LIMITS) -> SandboxResult:
    """Define `source` (Python code), call `function` on the value of `argument` (a Python literal,
    parsed with ast.literal_eval inside the sandbox; a tuple literal is NOT unpacked — the function
    takes one argument), and return repr(result). Never raises for anything the code does."""
    task = json.dumps(
        {
            "source": source,
            "function": function,
            "argument": argument,
            "banned": list(limits.banned_modules),
            "processes": limits.processes,
            "max_output": MAX_OUTPUT_CHARS,
        }
    ).encode()
    with tempfile.TemporaryDirectory(prefix="sandbox-", ignore_cleanup_errors=True) as workdir:
        with subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _RUNNER],
            cwd=workdir,
            env=_ENV,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        ) as proc:
            deadline = time.monotonic() + limits.wall_seconds
            try:
                _set_limits(proc.pid, limits)
                stdout, stderr, cut = _exchange(proc, task, deadline)
                if cut is None:
                    proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:  # it closed its pipes but kept running
                stdout, stderr, cut = b"", b"", "timeout"
            finally:
                # Also ends anything the task started in its process group.
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
    return _result(proc.returncode, stdout, stderr, cut, limits)


def verify(source: str, function: str, argument: str, limits: SandboxLimits = DEFAULT_LIMITS) -> SandboxResult:
    """run_function twice; ok only if both ran and their outputs agree (else error "output is not deterministic")."""
    first = run_function(source, function, argument, limits)
    if not first.ok:
        return first
    second = run_function(source, function, argument, limits)
    if second.ok and second.output != first.output:
        return SandboxResult(False, error="output is not deterministic")
    return second


def verify_many(
    tasks: Sequence[tuple[str, str, str]], limits: SandboxLimits = DEFAULT_LIMITS, workers: int = 16
) -> list[SandboxResult]:
    """verify() for many (source, function, argument) tasks concurrently (a thread pool; each run is its
    own process), results in order."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda task: verify(*task, limits), tasks))


def _set_limits(pid: int, limits: SandboxLimits) -> None:
    cpu = math.ceil(limits.cpu_seconds)
    memory = limits.memory_mb * 2**20
    file_size = limits.file_size_kb * 2**10
    settings = [
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),  # SIGXCPU, then SIGKILL if the task ignores it
        (resource.RLIMIT_AS, (memory, memory)),
        (resource.RLIMIT_FSIZE, (file_size, file_size)),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    if limits.processes == 0:
        settings.append((resource.RLIMIT_NPROC, (0, 0)))
    try:
        for which, values in settings:
            resource.prlimit(pid, which, values)
    except ProcessLookupError:  # it died at start; its exit status tells why
        pass


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


def _result(returncode: int, stdout: bytes, stderr: bytes, cut: str | None, limits: SandboxLimits) -> SandboxResult:
    if cut == "timeout":
        return SandboxResult(False, error=f"timed out after {limits.wall_seconds} s")
    if cut is not None:
        return SandboxResult(False, error="output too long")
    if returncode < 0:
        return SandboxResult(False, error=_signal_error(-returncode))
    try:
        record = json.loads(stdout.splitlines()[-1])
    except (IndexError, ValueError):
        record = None
    if isinstance(record, dict) and returncode == 0:
        if record.get("ok") is True and isinstance(record.get("output"), str):
            return SandboxResult(True, output=record["output"])
        if record.get("ok") is False and isinstance(record.get("error"), str):
            return SandboxResult(False, error=record["error"])
    detail = stderr.decode(errors="replace").strip().splitlines()[-1:]
    return SandboxResult(False, error=": ".join([f"no result from the sandbox (exit status {returncode})", *detail]))


def _signal_error(number: int) -> str:
    if number == signal.SIGXCPU:
        return "CPU time limit"
    if number == signal.SIGXFSZ:
        return "file size limit"
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    if number == signal.SIGKILL:
        return f"killed by {name} (CPU time or memory limit)"
    return f"killed by {name}"
