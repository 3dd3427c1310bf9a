"""Escapes from the sandbox, each tried twice: through the sandbox as training runs it (audit hook
and jail), and as a bare program in the jail with every standard-library module, ctypes included,
and no audit hook, the way code that gets past the hook would run. Whatever each attempt reports,
what is checked is the machine outside: the marker files it aims at are absent, the trainer's
open file and a bystander process are untouched, nothing connected to the trainer's socket, and
no process of the attempt outlives it. Last, the jail's own mark on the machine: the staging tree of
its root goes however its owner ends, and exposes no file that not everyone could read."""

from __future__ import annotations

import ast
import errno
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from selfplay.errors import UserError
from selfplay.roles import bubblewrap
from selfplay.roles.sandbox import LIMITS_PRELUDE, Sandbox, SandboxLimits, SandboxResult

pytestmark = pytest.mark.usefixtures("bubblewrap")

# What the attacks are handed, as one dict literal `x`: paths and processes of the machine outside.
ATTACKS = {
    "ctypes: libc's system() and a raw fork": """
import ctypes
def f(x):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.system(f"touch {x['marker']}".encode())
    pid = libc.syscall(57)  # fork
    if pid == 0:
        open(x['marker'], 'w').write('child')
    return pid, ctypes.get_errno()
""",
    "a C extension from the interpreter's site-packages": """
import importlib.machinery, importlib.util
def f(x):
    loader = importlib.machinery.ExtensionFileLoader('escape', x['site_extension'])
    spec = importlib.util.spec_from_file_location('escape', x['site_extension'], loader=loader)
    return importlib.util.module_from_spec(spec)
""",
    "a file outside the working directory": """
def f(x):
    with open(x['marker'], 'w') as out:
        out.write('escaped')
""",
    "a file where the trainer's next checkpoint goes": """
import os
def f(x):
    os.makedirs(x['checkpoint'], exist_ok=True)
    open(x['checkpoint'] + '/model.safetensors', 'w').write('planted')
""",
    "mknod of a block device, then raw reads": """
import os, stat
def f(x):
    os.mknod('disk', stat.S_IFBLK | 0o600, os.makedev(8, 0))
    return open('disk', 'rb').read(512)
""",
    "the machine's own disks under /dev": """
import os
def f(x):
    return os.listdir('/dev'), [open(d, 'rb').read(16) for d in ('/dev/vda', '/dev/sda', '/dev/nvme0n1')]
""",
    "mkfifo in and outside the working directory": """
import os
def f(x):
    os.mkfifo('pipe')
    os.mkfifo(x['marker'])
""",
    "a path relative to a directory descriptor": """
import os
def f(x):
    root = os.open('/', os.O_RDONLY)
    os.open(x['marker'].lstrip('/'), os.O_WRONLY | os.O_CREAT, dir_fd=root)
""",
    "an over-long relative path": """
import os
def f(x):
    os.open('../' * 64 + x['marker'].lstrip('/'), os.O_WRONLY | os.O_CREAT)
""",
    "writing to inherited descriptors": """
import os
def f(x):
    hits = 0
    for fd in range(3, 1024):
        try:
            os.write(fd, b'forged result')
            hits += 1
        except OSError:
            pass
    return hits
""",
    "signals to the trainer, the bystander and everyone": """
import os, signal
def f(x):
    for pid in (x['trainer'], x['bystander'], os.getppid(), -1):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
""",
    "pidfd_send_signal to the trainer": """
import os, signal
def f(x):
    signal.pidfd_send_signal(os.pidfd_open(x['trainer']), signal.SIGKILL)
""",
    "a process that outlives the sandbox": """
import os
def f(x):
    if os.fork() == 0:
        os.setsid()
        os.execv(x['python'], [x['python'], '-c', 'import time; time.sleep(60)', x['marker']])
    return 1
""",
    "posix_spawn of a shell": """
import os
def f(x):
    return os.posix_spawn('/bin/sh', ['sh', '-c', f"touch {x['marker']}"], {})
""",
    "gadget chain through object.__subclasses__()": """
def f(x):
    wrap = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]
    OS = wrap.__init__.__globals__
    fd = OS['open'](x['marker'], OS['O_WRONLY'] | OS['O_CREAT'])
    return OS['write'](fd, b'escaped')
""",
    "a socket to the trainer's port": """
import socket
def f(x):
    socket.create_connection(('127.0.0.1', x['port']), timeout=1).sendall(b'hello')
""",
    "secrets of the machine": """
def f(x):
    return [open(path).read() for path in ('/etc/shadow', '/proc/1/environ', x['secret'])]
""",
    "a new user namespace with ctypes": """
import ctypes
def f(x):
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.unshare(0x10000000), ctypes.get_errno()  # CLONE_NEWUSER
""",
    "ptrace of the jail's init": """
import ctypes
def f(x):
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.ptrace(16, 1, None, None), ctypes.get_errno()  # PTRACE_ATTACH
""",
    "a fork bomb": """
import os
def f(x):
    while True:
        os.fork()
""",
    "a thread bomb": """
import threading, time
def f(x):
    while True:
        threading.Thread(target=time.sleep, args=(60,)).start()
""",
    "a memory bomb": """
def f(x):
    blocks = []
    while True:
        blocks.append(bytearray(10**7))
""",
    "an infinite loop": """
def f(x):
    while True:
        pass
""",
    "huge output": """
def f(x):
    return 'x' * 10**7
""",
}

# A bare program in the jail: the sandbox's limits, the attack called on argv[4], and one line
# saying how it ended.
BARE = (
    LIMITS_PRELUDE
    + """
import ast
{source}
try:
    print("returned", repr(f(ast.literal_eval(sys.argv[4])))[:200])
except BaseException as err:
    print("raised", type(err).__name__, str(err)[:200])
"""
)


@pytest.fixture
def outside(tmp_path):
    """The machine outside the jail: a directory of the trainer's, a file it has open, a bystander
    process, a listening socket, and a secret. Yields the attack's argument; afterwards asserts
    that none of it changed."""
    home = tmp_path / "run"
    home.mkdir()
    marker = tmp_path / f"escaped-{uuid.uuid4().hex}"
    (home / "secret").write_text("token")
    log = open(home / "trainer.log", "wb")
    os.set_inheritable(log.fileno(), True)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    site_extension = next(Path(sysconfig.get_paths()["platlib"]).rglob("*.so"))
    argument = {
        "marker": str(marker),
        "checkpoint": str(home / "checkpoints" / "step-000002"),
        "site_extension": str(site_extension),
        "trainer": os.getpid(),
        "bystander": bystander.pid,
        "port": listener.getsockname()[1],
        "secret": str(home / "secret"),
        "python": sys.executable,
    }
    yield repr(argument)
    try:
        assert not marker.exists(), "a file appeared outside the jail"
        assert sorted(p.name for p in home.iterdir()) == ["secret", "trainer.log"], "the run directory changed"
        assert (home / "trainer.log").read_bytes() == b"", "the trainer's open file was written"
        assert bystander.poll() is None, "the bystander process was killed"
        with pytest.raises(BlockingIOError):
            listener.accept()
        assert not _processes_naming(str(marker)), "a process of the attempt outlived it"
    finally:
        bystander.kill()
        bystander.wait()
        listener.close()
        log.close()


def _processes_naming(text: str, wanted: bool = False) -> list[str]:
    """Processes other than bwrap's own whose command line holds `text`, once there are none (or,
    with `wanted`, some), or after three seconds: the jail's processes take a moment to start and
    to die with it."""
    deadline = time.monotonic() + 3
    while True:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                words = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if text in words and words[0] != "bwrap":
                found.append(pid)
        if bool(found) == wanted or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


LIMITS = SandboxLimits(cpu_seconds=1, wall_seconds=3, memory_mb=256)


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_through_the_sandbox_the_attempt_fails_and_nothing_outside_changes(attack, outside):
    result = Sandbox(LIMITS).run(ATTACKS[attack], "f", outside)
    assert not result.ok, result


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_in_the_bare_jail_without_the_audit_hook_nothing_outside_changes(attack, outside):
    said = run_bare(ATTACKS[attack], outside)
    assert said.startswith(("returned", "raised", "killed")), f"the attack did not run: {said}"


def run_bare(source: str, argument: str, timeout: float = 10) -> str:
    """Run the attack as a plain program, under the sandbox's limits, in a jail that holds the whole
    standard library. Returns the line it printed, or the signal that killed it."""
    jail = bubblewrap.jail(frozenset())
    fd = bubblewrap.seccomp_descriptor(jail)
    try:
        done = subprocess.run(
            jail.command(BARE.format(source=source), [*LIMITS.arguments(), argument], fd),
            pass_fds=(fd,),
            capture_output=True,
            text=True,
            timeout=timeout,
            **bubblewrap.spawn_options(jail),
        )
    finally:
        os.close(fd)
    if done.returncode > 128 and not done.stdout:  # bwrap's exit status for a program killed by a signal
        return f"killed by {signal.Signals(done.returncode - 128).name}"
    return (done.stdout + done.stderr).strip()


def test_in_the_bare_jail_the_code_runs_as_nobody_with_nothing_of_the_machine():
    listing = """
import os
def f(x):
    return os.getuid(), os.listdir('/'), os.listdir('/work'), os.path.exists('/proc/1'), os.getcwd()
"""
    said = run_bare(listing, "0")
    uid, top, work, proc, cwd = ast.literal_eval(said.removeprefix("returned "))
    assert uid == bubblewrap.NOBODY and work == [] and not proc and cwd == "/work"
    assert set(top) <= {"dev", "lib", "lib64", "usr", "work", *Path(sys.base_prefix).parts[1:2]}


def test_the_jailed_process_is_unprivileged_outside_the_jail_too():
    marker = f"uid-check-{uuid.uuid4().hex}"
    sandbox = Sandbox(SandboxLimits(wall_seconds=10))
    jail = sandbox.jail
    fd = bubblewrap.seccomp_descriptor(jail)
    try:
        proc = subprocess.Popen(
            jail.command("import time; time.sleep(5)", [marker], fd), pass_fds=(fd,), **bubblewrap.spawn_options(jail)
        )
    finally:
        os.close(fd)
    try:
        (pid,) = _processes_naming(marker, wanted=True)
        uids = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Uid:"))
        expected = bubblewrap.NOBODY if os.geteuid() == 0 else os.geteuid()
        assert uids.split()[1:] == [str(expected)] * 4
    finally:
        proc.kill()
        proc.wait()


def test_the_sandbox_still_computes():
    assert Sandbox(LIMITS).run("def f(x):\n    return sum(x)", "f", "[1, 2, 3]") == SandboxResult(True, "6")


# A trainer, as far as the jail's staging tree goes: it builds the jail, says where the tree is, and
# lives for argv[1] seconds.
OWNER = """
import sys, time
from selfplay.roles import bubblewrap
print(bubblewrap.jail(frozenset()).root.parent, flush=True)
time.sleep(float(sys.argv[1]))
"""


@pytest.fixture
def temporary():
    """A temporary directory for OWNERs alone, where the jail's uid can reach it: beside the one the
    jails of this process are built in (pytest's tmp_path is behind a folder only its owner may enter)."""
    path = Path(tempfile.mkdtemp(prefix="staging-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def start_owner(temporary: Path, seconds: float = 60) -> tuple[subprocess.Popen, Path]:
    """An OWNER whose temporary directory is `temporary`, and its staging tree once built."""
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(seconds)],
        env={**os.environ, "TMPDIR": str(temporary)},
        stdout=subprocess.PIPE,
        text=True,
    )
    with owner.stdout:
        return owner, Path(owner.stdout.readline().strip())


def test_the_next_build_removes_the_staging_tree_of_a_killed_owner_and_not_a_live_ones(temporary):
    live, live_tree = start_owner(temporary)
    killed, killed_tree = start_owner(temporary)
    try:
        killed.kill()
        killed.wait()
        assert killed_tree.is_dir(), "SIGKILL gives no chance to clean up"
        finished, _ = start_owner(temporary, seconds=0)
        assert finished.wait() == 0
        assert list(temporary.iterdir()) == [live_tree]
    finally:
        live.kill()
        live.wait()


def test_sigterm_removes_the_owners_staging_tree_and_ends_it_as_sigterm_does(temporary):
    owner, tree = start_owner(temporary)
    assert tree.is_dir()
    owner.terminate()
    assert owner.wait() == -signal.SIGTERM
    assert list(temporary.iterdir()) == []


def test_the_jails_tree_takes_only_files_everyone_may_read_and_copies_allow_no_more(tmp_path, monkeypatch):
    modes = {"private.py": 0o600, "setuid": 0o4775, "plain.py": 0o644}
    (tmp_path / "install").mkdir()
    for name, mode in modes.items():
        (tmp_path / "install" / name).write_text("x")
        (tmp_path / "install" / name).chmod(mode)

    def across_filesystems(source, target):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", across_filesystems)
    root = tmp_path / "root"
    for name in modes:
        bubblewrap._place(root, tmp_path / "install" / name)
    placed = {path.name: stat.S_IMODE(path.stat().st_mode) for path in root.rglob("*") if path.is_file()}
    assert placed == {"setuid": 0o755, "plain.py": 0o644}
    private = os.path.realpath(tmp_path / "install" / "private.py")
    with pytest.raises(UserError, match=re.escape(f"`chmod o+r {private}`")):
        bubblewrap._place(root, tmp_path / "install" / "private.py", needed=True)


def test_the_jail_takes_the_libraries_the_interpreter_loads_under_the_jails_own_loader_settings(monkeypatch):
    # vLLM on CPU sets LD_PRELOAD in the trainer's environment; the jail starts with a clear one.
    import torch

    preloaded = next((Path(torch.__file__).parent / "lib").glob("libgomp*.so*"))
    python = Path(bubblewrap._real_executable())
    monkeypatch.setenv("LD_PRELOAD", str(preloaded))
    assert preloaded.name in subprocess.run(["ldd", str(python)], capture_output=True, text=True).stdout
    assert all(library.name != preloaded.name for library in bubblewrap._shared_libraries([python]))
