"""Run untrusted Python snippets in a separate, limited process: :func:`run_python`.

Layers (each covered by adversarial tests in ``tests/envs/test_sandbox.py`` and, for reads,
``tests/envs/test_sandbox_reads.py``):

- a fresh ``python -I -S -u`` process (isolated mode: no site-packages, no ``PYTHON*`` variables, no
  script directory on ``sys.path``) in its own session and process group, with a clean environment
  (minimal ``PATH``, ``HOME``/``TMPDIR`` pointing at the sandbox directory, nothing of the caller's);
- when ``unshare`` works (detected once, cached): a new network namespace (no interfaces but a down
  loopback) and a new PID namespace, so everything the code starts dies with it;
- when the kernel has Landlock (detected once, cached; ``_landlock.py``): the kernel confines reads to the
  sandbox directory and what the interpreter needs (:func:`sandbox_paths`), writes to the sandbox directory,
  denies TCP and signals to outside processes; without Landlock one loud line says so and the audit hook below
  is the only read guard;
- resource limits in the worker: ``RLIMIT_CPU``, ``RLIMIT_AS``, ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``,
  ``RLIMIT_CORE=0`` and, if given, ``RLIMIT_NPROC`` (per user, and not enforced for root);
- an audit hook installed before the user code runs (see ``_bootstrap.py``) that refuses process
  creation, sockets, ``ctypes``, writes outside the sandbox directory, reads and listings outside the paths
  of :func:`sandbox_paths`, reading other processes' ``/proc`` entries, signalling other processes and raising
  the limits;
- the caller reads both pipes incrementally, caps the output, enforces the wall-clock limit and kills
  the whole process group at the end, whatever happened.

With Landlock the kernel bounds file access, TCP and signals even for native code; the rest (and everything
without Landlock) rests on the audit hook, which is *not* a security boundary against determined attackers
(interpreter bugs, introspection, races). Run untrusted workloads in containers or gVisor as well. See
``docs/tool_use.md``.
"""

from __future__ import annotations

import functools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

_BOOTSTRAP = str(Path(__file__).with_name("_bootstrap.py"))
_LANDLOCK = str(Path(__file__).with_name("_landlock.py"))
# Must match _bootstrap.EXIT_MEMORY / EXIT_BLOCKED and _landlock.EXIT_SETUP (scripts, not imported here).
_EXIT_MEMORY = 86
_EXIT_BLOCKED = 87
_EXIT_SETUP = 88
#: Shared-library directories the interpreter and its extension modules load from (read and execute).
SYSTEM_LIBRARY_DIRS = ("/lib", "/lib32", "/lib64", "/libx32", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/local/lib")
#: Other files the standard library reads: the loader cache, time zones, random and empty devices.
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/usr/share/zoneinfo", "/dev/urandom", "/dev/random", "/dev/zero")
#: Program directories, readable and executable only with ``allow_processes=True``.
PROGRAM_DIRS = ("/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin")
#: Seconds the caller may wait beyond ``wall_timeout_s`` (process start, kill, pipe drain).
GRACE_S = 1.0
_READ_CHUNK = 65536


@dataclass(frozen=True)
class SandboxResult:
    """The outcome of one :func:`run_python` call.

    Attributes:
        ok: the code ran to completion and exited with status 0.
        stdout: captured standard output (UTF-8, undecodable bytes replaced; capped).
        stderr: captured standard error (same cap, shared with stdout).
        error: ``None`` when ok, else a short reason: ``"timeout"``, ``"cpu time limit"``,
            ``"memory limit"``, ``"output truncated"``, ``"killed by signal N"``,
            ``"blocked: <what>"`` (e.g. ``"blocked: network (socket.__new__)"``),
            ``"exit code N"``, or the last line of an uncaught exception (``"ZeroDivisionError: ..."``).
        exit_code: the worker's exit status, ``-N`` when killed by signal N, ``None`` when unknown
            (killed by the caller on timeout or output overflow).
        wall_s: seconds from start until the process was gone.
    """

    ok: bool
    stdout: str
    stderr: str
    error: str | None
    exit_code: int | None
    wall_s: float


def _probe(prefix: list[str]) -> bool:
    try:
        done = subprocess.run(
            [*prefix, sys.executable, "-I", "-S", "-c", "pass"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@functools.lru_cache(maxsize=1)
def namespace_prefix() -> tuple[str, ...]:
    """The ``unshare`` command prefix that works here (cached): net + PID namespaces, net only, or none."""
    if shutil.which("unshare") is None:
        return ()
    for prefix in (
        ["unshare", "--net", "--pid", "--fork", "--kill-child", "--"],
        ["unshare", "--net", "--"],
    ):
        if _probe(prefix):
            return tuple(prefix)
    return ()


@functools.lru_cache(maxsize=1)
def interpreter() -> str:
    """The real Python executable the sandbox runs (a virtualenv's ``python`` resolved: ``-I -S`` uses no
    site-packages, so the base interpreter runs the same standard library)."""
    return os.path.realpath(sys.executable)


@functools.lru_cache(maxsize=1)
def interpreter_paths() -> tuple[str, ...]:
    """What the interpreter reads: its ``-I -S`` ``sys.path`` (standard library, ``lib-dynload``) and its
    ``libpython`` files (asked once of the interpreter itself, cached)."""
    probe = (
        "import glob, json, os, sys, sysconfig\n"
        "libdir = sysconfig.get_config_var('LIBDIR') or ''\n"
        "print(json.dumps(sys.path + glob.glob(os.path.join(libdir, 'libpython*'))))"
    )
    done = subprocess.run(
        [interpreter(), "-I", "-S", "-c", probe], capture_output=True, text=True, timeout=30, check=True
    )
    return tuple(json.loads(done.stdout))


def sandbox_paths(root: str, work: str, allow_processes: bool = False) -> dict[str, list[str]]:
    """The paths a sandbox run may use (real paths of those that exist): ``read`` (read and list), ``exec`` (also
    execute) and ``write`` (full use). Everything else is unreadable: the user's files, the project, ``/etc``
    (but the loader cache and the local time zone), ``/proc`` and ``/sys``."""

    def real(paths) -> list[str]:
        return sorted({os.path.realpath(p) for p in paths if os.path.exists(p)})

    programs = PROGRAM_DIRS if allow_processes else ()
    return {
        "read": real([*interpreter_paths(), root, _BOOTSTRAP, *SYSTEM_FILES]),
        "exec": real([interpreter(), *SYSTEM_LIBRARY_DIRS, *programs]),
        "write": real([work, "/dev/null"]),
    }


@functools.lru_cache(maxsize=1)
def landlock_abi() -> int:
    """The kernel's Landlock ABI version as the sandbox process sees it (0: none), probed once per process; when
    there is none, one warning line on stderr says that file reads are confined by the audit hook alone."""
    try:
        done = subprocess.run(
            [interpreter(), "-I", "-S", _LANDLOCK, "--abi"], capture_output=True, text=True, timeout=10
        )
        abi = int(done.stdout.strip() or 0)
    except (OSError, ValueError, subprocess.SubprocessError):
        abi = 0
    if abi < 1:
        print(
            "[roll] WARNING: tool sandbox: this kernel offers no Landlock (needs Linux >= 5.13 with the landlock "
            "LSM enabled, not filtered by seccomp): file reads of sandboxed code are confined by the Python audit "
            "hook only, which is not a security boundary (docs/tool_use.md)",
            file=sys.stderr,
            flush=True,
        )
    return abi


def _clean_env(work: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": work,
        "TMPDIR": work,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child leads its own session, so pgid == pid
    except (ProcessLookupError, PermissionError):
        pass


class _Collector:
    """Reads stdout/stderr incrementally, keeping at most ``cap`` bytes in total."""

    def __init__(self, proc: subprocess.Popen, cap: int) -> None:
        self.cap = cap
        self.out_fd, self.err_fd = proc.stdout.fileno(), proc.stderr.fileno()
        self.chunks: dict[int, list[bytes]] = {self.out_fd: [], self.err_fd: []}
        self.total = 0
        self.overflow = False
        self.selector = selectors.DefaultSelector()
        for stream in (proc.stdout, proc.stderr):
            os.set_blocking(stream.fileno(), False)
            self.selector.register(stream.fileno(), selectors.EVENT_READ)

    @property
    def open(self) -> bool:
        return bool(self.selector.get_map())

    def pump(self, timeout: float) -> None:
        """Read whatever is ready within ``timeout`` seconds; unregister pipes at EOF."""
        for key, _ in self.selector.select(max(timeout, 0.0)):
            try:
                data = os.read(key.fd, _READ_CHUNK)
            except BlockingIOError:
                continue
            if not data:
                self.selector.unregister(key.fd)
                continue
            room = self.cap - self.total
            if len(data) > room:
                data, self.overflow = data[: max(room, 0)], True
            self.total += len(data)
            self.chunks[key.fd].append(data)

    def text(self, fd: int) -> str:
        return b"".join(self.chunks[fd]).decode("utf-8", errors="replace")

    def close(self) -> None:
        self.selector.close()


def _classify(status: str, stderr: str, cpu_limit: int) -> tuple[int | None, str | None]:
    """Map the supervisor's report (``"exit N cpu"`` / ``"signal N cpu"``) to (exit_code, error)."""
    parts = status.split()
    if len(parts) != 3:
        return None, "killed by signal 9"  # the supervisor itself died without reporting
    kind, number, cpu = parts[0], int(parts[1]), float(parts[2])
    if kind == "signal":
        if number == signal.SIGXCPU or (number == signal.SIGKILL and cpu >= cpu_limit - 0.05):
            return -number, "cpu time limit"
        return -number, f"killed by signal {number}"
    if number == 0:
        return 0, None
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    if number == _EXIT_MEMORY:
        return number, "memory limit"
    if number == _EXIT_BLOCKED or (number == 1 and lines and "blocked: " in lines[-1]):
        # also a violation wrapped by library code, e.g. URLError(<urlopen error blocked: network ...>)
        reason = next((line for line in reversed(lines) if "blocked: " in line), "blocked: ")
        return number, reason[reason.index("blocked: ") :].rstrip(">'\"")[:200]
    if number == 1 and lines:
        return number, lines[-1][:200]
    return number, f"exit code {number}"


def run_python(
    code: str,
    *,
    wall_timeout_s: float = 5.0,
    cpu_time_s: int = 5,
    memory_mb: int = 512,
    max_output_bytes: int = 16384,
    max_processes: int | None = 64,
    file_size_mb: int = 16,
    max_open_files: int = 64,
    use_namespaces: bool = True,
    allow_processes: bool = False,
    use_landlock: bool = True,
) -> SandboxResult:
    """Run ``code`` in a fresh sandboxed Python process and return what happened.

    The call never raises for anything the code does and never blocks longer than
    ``wall_timeout_s + GRACE_S`` seconds. The private working directory is removed afterwards.

    Args:
        code: Python source (standard library only; no site-packages).
        wall_timeout_s: wall-clock limit; on expiry the whole process group is killed (``"timeout"``).
        cpu_time_s: CPU-seconds limit (``RLIMIT_CPU``; ``"cpu time limit"``).
        memory_mb: address-space limit (``RLIMIT_AS``; ``"memory limit"``).
        max_output_bytes: cap on stdout + stderr together; beyond it the process is killed
            (``"output truncated"``) and the first ``max_output_bytes`` bytes are kept.
        max_processes: ``RLIMIT_NPROC`` (per user, ignored for root; ``None`` leaves it unset).
            Process creation is refused by the audit hook in any case.
        file_size_mb: largest file the code may write (``RLIMIT_FSIZE``).
        max_open_files: ``RLIMIT_NOFILE``.
        use_namespaces: use ``unshare`` network/PID namespaces when they work here.
        allow_processes: let the code start processes (trusted code only, e.g. shelling out to a
            tool); they are still killed with the sandbox's process group / PID namespace. The program
            directories (:data:`PROGRAM_DIRS`) then become readable and executable.
        use_landlock: confine file access in the kernel when it offers Landlock (the audit hook confines
            reads in any case).

    Raises:
        ValueError: a limit is not positive.
    """
    for name, value in (
        ("wall_timeout_s", wall_timeout_s),
        ("cpu_time_s", cpu_time_s),
        ("memory_mb", memory_mb),
        ("max_output_bytes", max_output_bytes),
        ("file_size_mb", file_size_mb),
        ("max_open_files", max_open_files),
    ):
        if not value > 0:
            raise ValueError(f"run_python: {name}={value!r} must be > 0.")
    if not isinstance(code, str):
        raise TypeError(f"run_python: code must be str, got {type(code).__name__}.")
    root = tempfile.mkdtemp(prefix="roll-sandbox-")
    try:
        work = os.path.join(root, "work")
        os.mkdir(work, 0o700)
        Path(root, "main.py").write_text(code, encoding="utf-8")
        paths = sandbox_paths(root, work, allow_processes)
        limits = {
            "cpu_time_s": int(cpu_time_s),
            "memory_bytes": int(memory_mb) << 20,
            "file_size_bytes": int(file_size_mb) << 20,
            "max_open_files": int(max_open_files),
            "max_processes": max_processes,
            "allow_processes": bool(allow_processes),
            "read_paths": [p for group in paths.values() for p in group],
        }
        confine = (
            [interpreter(), "-I", "-S", _LANDLOCK, json.dumps(paths), "--"] if use_landlock and landlock_abi() else []
        )
        return _run(root, work, limits, wall_timeout_s, max_output_bytes, use_namespaces, confine)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run(
    root: str, work: str, limits: dict, wall_timeout_s: float, cap: int, use_ns: bool, confine: list[str]
) -> SandboxResult:
    prefix = [*(namespace_prefix() if use_ns else ()), *confine]
    status_r, status_w = os.pipe()
    start = time.monotonic()
    deadline = start + wall_timeout_s
    try:
        proc = subprocess.Popen(
            [*prefix, interpreter(), "-I", "-S", "-u", _BOOTSTRAP, root, work, str(status_w), json.dumps(limits)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=work,
            env=_clean_env(work),
            start_new_session=True,
            pass_fds=(status_w,),
        )
    finally:
        os.close(status_w)
    collector = _Collector(proc, cap)
    reason: str | None = None
    try:
        while proc.poll() is None:
            now = time.monotonic()
            if now >= deadline:
                reason = "timeout"
                break
            if collector.overflow:
                reason = "output truncated"
                break
            if collector.open:
                collector.pump(min(deadline - now, 0.05))
            else:
                time.sleep(min(deadline - now, 0.01))
        # Whatever happened, nothing of the group may outlive the call.
        _kill_group(proc)
        drain_until = min(time.monotonic() + 0.5, deadline + GRACE_S / 2)
        while collector.open and time.monotonic() < drain_until and not collector.overflow:
            collector.pump(0.05)
        try:
            proc.wait(timeout=GRACE_S / 2)
        except subprocess.TimeoutExpired:
            pass
        wall = time.monotonic() - start
        status = _read_status(status_r)
    finally:
        collector.close()
        proc.stdout.close()
        proc.stderr.close()
        os.close(status_r)
    stdout, stderr = collector.text(collector.out_fd), collector.text(collector.err_fd)
    if reason is None and collector.overflow:
        reason = "output truncated"
    if reason is not None:
        return SandboxResult(False, stdout, stderr, reason, None, wall)
    if not status and proc.returncode == _EXIT_SETUP:  # _landlock.py could not confine: nothing ran
        return SandboxResult(False, stdout, stderr, f"sandbox setup failed: {stderr.strip()[-200:]}", _EXIT_SETUP, wall)
    exit_code, error = _classify(status, stderr, limits["cpu_time_s"])
    return SandboxResult(error is None, stdout, stderr, error, exit_code, wall)


def _read_status(fd: int) -> str:
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 256).decode("ascii", errors="replace")
    except BlockingIOError:
        return ""
