"""Torch JIT-build locks: keep DeepSpeed from JIT-building its CPU comm op, and find build locks left by killed builds.

``torch.utils.cpp_extension.load`` builds an extension in ``<root>/<name>/`` under the lock file
``<root>/<name>/lock``, created with ``O_EXCL`` and held open by the building process until the build ends. Another
process that finds the file waits (``FileBaton.wait``) until it disappears: forever and silently when the build was
killed (Ctrl-C, a timeout), since nothing then removes the file.

DeepSpeed's ``init_distributed`` JIT-builds its shared-memory comm op (``deepspeed_shm_comm``) on CPU: 65-75 s and
1.5 GB at the first start on a machine, and the hang above after a killed first start. That op serves only
DeepSpeed's ``inference_all_reduce`` (tensor-parallel DeepSpeed inference), which roll never calls; training
collectives go through ``torch.distributed`` (gloo). :func:`prepare_deepspeed_comm` therefore marks it unavailable
before DeepSpeed starts, so a CPU run builds nothing and waits on no lock.

:func:`find_build_locks` classifies every lock under the extensions root: *held* (a live process has the lock open
or works in the build directory: a build in progress) or *stale* (no process does: a killed build left it). A stale
lock is reported with the command that removes it (``roll doctor``, and once at a DeepSpeed start); it is never
removed automatically, since a builder in another PID namespace sharing the directory cannot be seen from here.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

SHM_COMM_OP = "deepspeed_shm_comm"
"""DeepSpeed's CPU shared-memory comm op (``ShareMemCommBuilder.NAME``)."""
BUILDER_NAMES = ("python", "ninja", "cc1plus", "c++", "g++", "gcc", "ld")
"""Command-name prefixes of processes that may hold a build lock (the Python process that builds, ninja, the
compiler): a process of another user with one of these names makes a lock's state unknown instead of stale."""


def extensions_root() -> Path:
    """Where torch builds JIT extensions: ``TORCH_EXTENSIONS_DIR``, else ``<user cache>/torch_extensions`` (torch adds
    a ``py311_cpu``-style folder under the latter; :func:`find_build_locks` looks one level deeper for it)."""
    explicit = os.environ.get("TORCH_EXTENSIONS_DIR")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "torch_extensions"


@dataclasses.dataclass(frozen=True)
class BuildLock:
    """One ``lock`` file of a build directory; ``holders`` are the pids holding it (empty: stale), None when a
    process that may be a builder could not be inspected (not ours to judge)."""

    path: Path
    holders: tuple[int, ...] | None

    @property
    def stale(self) -> bool:
        """No process holds the lock or works in its build directory: a killed build left it."""
        return self.holders == ()

    def message(self) -> str:
        """One line saying what the lock is and what to do about it."""
        if self.stale:
            return (
                f"stale torch extension build lock {self.path} (no process holds it: a killed build left it); "
                f"any build of {self.path.parent.name!r} waits on it forever: remove it with: rm {self.path}"
            )
        if self.holders is None:
            return (
                f"torch extension build lock {self.path}: its builder could not be checked (processes of other "
                f"users); if no build is running, remove it with: rm {self.path}"
            )
        return f"torch extension build lock {self.path}: a build is running (pid {', '.join(map(str, self.holders))})"


def _holders(lock: Path, proc: Path) -> tuple[int, ...] | None:
    """Pids that have ``lock`` open or work in its build directory (ninja, the compiler); None when some process's
    open files cannot be read (another user's: it may be the builder)."""
    lock_s, build_dir = str(lock.resolve()), lock.parent.resolve()
    holders, blind = [], False
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if _works_in(entry, build_dir) or any(_target(fd) == lock_s for fd in (entry / "fd").iterdir()):
                holders.append(int(entry.name))
        except FileNotFoundError:  # the process ended meanwhile
            continue
        except PermissionError:  # not ours to inspect: a possible holder if it is a builder
            blind = blind or _may_build(entry)
    return tuple(holders) if holders or not blind else None


def _target(fd: Path) -> str | None:
    """What open file ``fd`` points at; None when it was closed meanwhile (a busy process opens and closes files
    between the listing and the read: that must not hide the process)."""
    try:
        return os.readlink(fd)
    except FileNotFoundError:
        return None


def _may_build(entry: Path) -> bool:
    """Whether process ``entry`` (whose open files cannot be read) may be a builder: Python (the lock holder),
    ninja or a compiler, by its command name."""
    try:
        name = (entry / "comm").read_text().strip()
    except OSError:
        return True
    return name.startswith(BUILDER_NAMES)


def _works_in(entry: Path, build_dir: Path) -> bool:
    """Whether process ``entry``'s working directory is ``build_dir`` or below it (False when unreadable)."""
    try:
        cwd = Path(os.readlink(entry / "cwd"))
    except OSError:
        return False
    return cwd == build_dir or build_dir in cwd.parents


def find_build_locks(root: Path | None = None, proc: Path = Path("/proc")) -> list[BuildLock]:
    """Every ``<root>/<name>/lock`` and ``<root>/<pyXY_cpu>/<name>/lock``, with its holders (Linux ``/proc``)."""
    root = extensions_root() if root is None else root
    if not root.is_dir():
        return []
    locks = sorted(set(root.glob("*/lock")) | set(root.glob("*/*/lock")))
    if not locks:
        return []
    if not proc.is_dir():  # no /proc: holders unknown
        return [BuildLock(p, None) for p in locks]
    return [BuildLock(p, _holders(p, proc)) for p in locks]


def prepare_deepspeed_comm(on_gpu: bool) -> None:
    """Before ``deepspeed.init_distributed``: on CPU, mark DeepSpeed's shm comm op unavailable (no JIT build, no
    lock to wait on; see the module docstring); report stale build locks in one line each."""
    if not on_gpu:
        import deepspeed.ops

        # DeepSpeed's probe result, cached in the module on first access; build_shm_op reads it and then falls
        # back to the plain torch.distributed collectives.
        deepspeed.ops.__compatible_ops__[SHM_COMM_OP] = False
    for lock in find_build_locks():
        if lock.stale:
            print(f"[roll] warning: {lock.message()}", file=sys.stderr, flush=True)
