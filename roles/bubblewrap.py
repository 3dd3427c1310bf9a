"""The operating-system boundary around model-written code: a bubblewrap (`bwrap`) jail.

Each run gets fresh user, PID, network, mount, IPC, UTS and cgroup namespaces, and sees a
read-only root that holds only what the sandbox's runner needs: the Python interpreter, its
shared libraries, and the standard library without site-packages and without the modules the
sandbox bans (ctypes, sockets, subprocess, mmap, ...), so that a task that gets past the runner's
import guard still finds no C code to call the kernel with. Its working directory is a fresh,
empty tmpfs, read-only like the rest, so the task creates no files and writes no bytes: the
file-count and file-size limits are zero. A seccomp filter refuses new processes (threads
included), namespaces, mounts, device nodes, tracing, sockets, kernel keyrings and the kernel's
random numbers (no /dev/urandom either: a run's randomness is its seed alone). The task runs
under the unprivileged uid 65534 ("nobody") outside the jail as well as inside when the trainer
runs as root; otherwise under the trainer's own uid, which the namespaces keep from everything
of the trainer's. No capability, no /proc, no network, and `--die-with-parent` plus the PID
namespace end every process the task could leave behind.

The root is built once per process in the temporary directory and holds only files that everyone
may read: hard links to them or, across filesystems, copies that allow no more than the originals.
Its owner removes it when it exits or is sent SIGTERM (where another handler has SIGTERM, the exit
that handler makes), and holds a lock on it while it lives, so that the next process to build a
root removes those whose owners were killed. `bwrap` is run as the uid that needs to read it.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import functools
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from selfplay.errors import UserError

NOBODY = 65534
WORKDIR = "/work"
STAGING_PREFIX = "selfplay-jail-"  # the jail roots' staging trees in the temporary directory
INSTALL_HINT = (
    "Model-written code runs only inside an operating-system sandbox, bubblewrap: install it "
    "(Debian/Ubuntu: `apt-get install bubblewrap`; Fedora: `dnf install bubblewrap`), or, on a machine "
    "you are willing to expose to the model's code, opt out with the game parameter sandbox=unsafe."
)
# Standard-library modules no task needs: tests, GUIs, terminals, installers, documentation data.
_UNNEEDED = {
    "site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data", "termios",
    "_curses_panel", "_ctypes_test", "_testbuffer", "_testclinic", "_testimportmultiple", "_testmultiphase",
    "_xxtestfuzz", "xxlimited", "xxlimited_35", "xxsubtype",
}  # fmt: skip
# Banned modules the runner itself imports before the task starts: they stay in the tree.
_RUNNER_MODULES = {"os", "sys", "threading", "importlib", "resource"}
CLONE_THREAD = 0x00010000
TIOCSTI = 0x5412
# How the sandbox starts the interpreter, in the jail and out of it: no site-packages (-S, -s) and no
# bytecode written (-B). Not -I: it would ignore PYTHONHASHSEED, and the environment needs no
# ignoring, as it holds only what python_environment() sets.
PYTHON_FLAGS = ("-S", "-s", "-B")


def python_environment(hash_seed: int) -> dict[str, str]:
    """The interpreter's whole environment: its hash seed pinned, so that the order of a set of strings
    is the same in every run under that seed, and the script's directory off the import path."""
    return {"PYTHONHASHSEED": str(hash_seed), "PYTHONSAFEPATH": "1"}


@dataclass(frozen=True)
class Jail:
    """A ready bubblewrap jail: the command that runs a Python program in it, and the seccomp
    program it loads."""

    root: Path  # the read-only tree mounted as the jail's /
    python: str  # the interpreter's path inside the jail
    library_path: str  # LD_LIBRARY_PATH inside the jail
    seccomp: bytes  # compiled BPF, handed to bwrap through a descriptor
    run_as: int | None  # the uid (and gid) bwrap runs as; None keeps the trainer's

    def command(self, program: str, args: list[str], seccomp_fd: int, hash_seed: int = 0) -> list[str]:
        environment = {"LD_LIBRARY_PATH": self.library_path, "PATH": "/nonexistent", **python_environment(hash_seed)}
        return [
            "bwrap",
            *("--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"),
            *("--unshare-cgroup-try", "--disable-userns", "--die-with-parent", "--new-session", "--cap-drop", "ALL"),
            *("--uid", str(NOBODY), "--gid", str(NOBODY), "--hostname", "sandbox"),
            *("--ro-bind", str(self.root), "/"),
            *("--dev-bind", "/dev/null", "/dev/null"),
            *("--tmpfs", WORKDIR, "--remount-ro", WORKDIR, "--chdir", WORKDIR),
            "--clearenv",
            *(word for name, value in environment.items() for word in ("--setenv", name, value)),
            *("--seccomp", str(seccomp_fd)),
            *(self.python, *PYTHON_FLAGS, "-c", program, *args),
        ]


@functools.cache
def jail(banned_modules: frozenset[str]) -> Jail:
    """The process's jail, built on first use. Raises UserError saying how to install bubblewrap
    when it is missing or cannot make namespaces here."""
    if shutil.which("bwrap") is None:
        raise UserError(f"bubblewrap (`bwrap`) is not installed. {INSTALL_HINT}")
    run_as = NOBODY if os.geteuid() == 0 else None
    root, libraries = _build_root(banned_modules)
    built = Jail(
        root=root,
        python=_real_executable(),
        library_path=":".join(sorted({str(library.parent) for library in libraries})),
        seccomp=_seccomp_program(),
        run_as=run_as,
    )
    _check_works(built)
    return built


def spawn_options(built: Jail) -> dict:
    """Keyword arguments for subprocess.Popen that start `bwrap` as the jail's uid."""
    if built.run_as is None:
        return {"cwd": "/"}
    return {"cwd": "/", "user": built.run_as, "group": built.run_as, "extra_groups": []}


def seccomp_descriptor(built: Jail) -> int:
    """A fresh descriptor holding the seccomp program, for one bwrap to read."""
    fd = os.memfd_create("sandbox-seccomp", os.MFD_CLOEXEC)
    os.write(fd, built.seccomp)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _real_executable() -> str:
    return os.path.realpath(sys._base_executable if hasattr(sys, "_base_executable") else sys.executable)


def _build_root(banned_modules: frozenset[str]) -> tuple[Path, set[Path]]:
    """The jail's / : the interpreter, the shared libraries it and its extension modules load,
    and the allowed standard library, each at its own absolute path. Returns it and those
    libraries' paths."""
    _remove_trees_of_killed_owners()
    staging = _owned_staging()
    root = staging / "root"
    excluded = (_UNNEEDED | set(banned_modules)) - _RUNNER_MODULES
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    extensions = []
    for folder, subfolders, files in os.walk(stdlib):
        top = Path(folder) == stdlib
        if top:  # packages are excluded whole, by name
            subfolders[:] = [d for d in subfolders if d not in excluded]
        for name in files:
            if name.partition(".")[0] in excluded and (top or Path(folder).name in ("__pycache__", "lib-dynload")):
                continue
            path = Path(folder) / name
            if path.parent.name == "lib-dynload":
                extensions.append(path)
            elif path.suffix not in (".py", ".pyc") or ".opt-" in name:
                continue
            _place(root, path)
    python = Path(_real_executable())
    libraries = _shared_libraries([python, *extensions])
    for needed in [python, *libraries]:
        _place(root, needed, needed=True)
    (root / "dev").mkdir(exist_ok=True)
    (root / "dev" / "null").touch()
    (root / WORKDIR.lstrip("/")).mkdir()
    for directory in [staging, *(p for p in root.rglob("*") if p.is_dir()), root]:
        directory.chmod(0o755)
    return root, libraries


def _place(root: Path, source: Path, needed: bool = False) -> None:
    """Put the file `source` names at that absolute path under `root`, if everyone may read it (the
    tree is open to everyone, and the jail's uid is nobody's): a hard link where the filesystem
    allows, else a copy that allows no more than the original. A `needed` file that not everyone
    may read is an error."""
    target = root / str(source).lstrip("/")
    if target.exists():
        return
    real = os.path.realpath(source)
    mode = os.stat(real).st_mode
    if not mode & stat.S_IROTH:
        if needed:
            raise UserError(
                f"The sandbox's jail holds only files that everyone may read, and {real}, which Python "
                f"needs in it, is not one: make it readable (`chmod o+r {real}`) or use a Python whose files are."
            )
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(real, target)
    except OSError:  # another filesystem
        shutil.copyfile(real, target)
        target.chmod(stat.S_IMODE(mode) & 0o755)  # nothing the original does not allow, and no set-id bits


# The staging trees this process built: it removes them as it ends. A forked child removes none.
_built_trees: list[Path] = []
os.register_at_fork(after_in_child=_built_trees.clear)


def _owned_staging() -> Path:
    """A new staging tree, empty but for its root folder, that this process holds a lock on until it
    ends, however it ends (the kernel drops the lock), and removes at exit or SIGTERM."""
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX))
    lock = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # held open for the process's life
    fcntl.flock(lock, fcntl.LOCK_EX)  # may wait for a sweep looking at it, which leaves a rootless tree be
    (staging / "root").mkdir()
    _remove_as_the_process_ends()
    _built_trees.append(staging)
    return staging


def _remove_trees_of_killed_owners() -> None:
    """Remove this user's staging trees whose owner died without removing them (killed): those with a
    root folder, which their owner made while holding the lock that no one holds now."""
    for staging in Path(tempfile.gettempdir()).glob(STAGING_PREFIX + "*"):
        try:
            fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # not a directory, not ours to read, or gone already
            continue
        try:
            if os.fstat(fd).st_uid == os.geteuid():
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if (staging / "root").is_dir():
                    shutil.rmtree(staging, ignore_errors=True)
        except BlockingIOError:  # its owner is alive
            pass
        finally:
            os.close(fd)


def _remove_built_trees() -> None:
    for staging in _built_trees:
        shutil.rmtree(staging, ignore_errors=True)
    _built_trees.clear()


@functools.cache
def _remove_as_the_process_ends() -> None:
    """Remove the built trees at exit, and on SIGTERM where its default (ending the process without
    running atexit) is in force and this thread may change it; another handler ends the process
    through its own exit, or leaves the trees to the next build's sweep."""
    atexit.register(_remove_built_trees)
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _remove_built_trees_and_end)


def _remove_built_trees_and_end(signum: int, frame) -> None:
    _remove_built_trees()
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)  # end as the default would have


_LDD_LINE = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x[0-9a-f]+\)")


def _shared_libraries(binaries: list[Path]) -> set[Path]:
    """Every shared library (and the dynamic loader) the binaries load, by `ldd`, under the loader
    settings of the jail, which starts with a clear environment: none of this process's LD_*
    variables (vLLM on CPU sets LD_PRELOAD in the trainer's own environment, for instance)."""
    environment = {name: value for name, value in os.environ.items() if not name.startswith("LD_")}
    found: set[Path] = set()
    for binary in binaries:
        listing = subprocess.run(
            ["ldd", str(binary)], capture_output=True, text=True, check=False, env=environment
        ).stdout
        found.update(Path(m[1]) for m in _LDD_LINE.finditer(listing))
    return found


def _seccomp_program() -> bytes:
    """A filter that allows every system call but these: new processes (a clone without
    CLONE_THREAD, fork, vfork; clone3 answers ENOSYS so that the C library falls back to clone),
    sockets, namespaces and mounts, device nodes, tracing and other processes' memory and
    descriptors, kernel keyrings, BPF, perf, userfaultfd, io_uring, modules, faking terminal input,
    and random numbers (getrandom: the interpreter's hash seed is pinned, so it needs none)."""
    import pyseccomp as seccomp

    denied = (
        "fork vfork socket socketpair ptrace process_vm_readv process_vm_writev kcmp pidfd_open pidfd_getfd "
        "pidfd_send_signal unshare setns mount umount2 pivot_root chroot open_tree move_mount fsopen fsmount "
        "fsconfig fspick mount_setattr mknod mknodat keyctl add_key request_key bpf perf_event_open userfaultfd "
        "io_uring_setup io_uring_enter io_uring_register kexec_load kexec_file_load init_module finit_module "
        "delete_module reboot swapon swapoff acct quotactl sethostname setdomainname syslog iopl ioperm "
        "name_to_handle_at open_by_handle_at getrandom"
    ).split()
    program = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    for name in denied:
        try:
            program.add_rule(seccomp.ERRNO(errno.EPERM), name)
        except (RuntimeError, ValueError, OSError):  # not a system call on this architecture
            continue
    program.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, CLONE_THREAD, 0))
    program.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    program.add_rule(seccomp.ERRNO(errno.EPERM), "ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, TIOCSTI))
    with tempfile.TemporaryFile() as exported:
        program.export_bpf(exported)
        exported.seek(0)
        return exported.read()


def _check_works(built: Jail) -> None:
    """Run one trivial program in the jail, so that a machine without user namespaces fails here
    with bwrap's own reason rather than at the first task."""
    fd = seccomp_descriptor(built)
    try:
        done = subprocess.run(
            built.command("print(6 * 7)", [], fd),
            pass_fds=(fd,),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            **spawn_options(built),
        )
    finally:
        os.close(fd)
    if done.stdout.strip() != "42":
        reason = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise UserError(f"bubblewrap cannot start a sandbox on this machine ({reason}). {INSTALL_HINT}")
