"""Runs as the sandbox process (``python -I -S _bootstrap.py ROOT WORK STATUS_FD LIMITS_JSON``).

Not imported by roll: :mod:`roll.envs.tool_use.sandbox` starts this file as a script. Standard library only.

Layout: this process is a *supervisor* (PID 1 when a PID namespace is available) that forks one
*worker*. The worker lowers its resource limits, reads the user code, patches the raw process-creation
primitive, installs an audit hook (which cannot be removed for the life of the interpreter) and runs the
code. The supervisor waits for the worker and reports ``exit N`` or ``signal N`` plus the worker's CPU
seconds on the private status pipe ``STATUS_FD``, which the worker closes before any user code runs.

Worker exit codes the caller understands: 0 ok, 1 uncaught exception, ``EXIT_MEMORY`` (MemoryError),
``EXIT_BLOCKED`` (an uncaught :class:`SandboxViolation`; the last stderr line holds the reason).
"""

import json
import os
import sys

EXIT_MEMORY = 86
EXIT_BLOCKED = 87

# Audit events that create processes or replace the program: always refused.
_PROCESS_EVENTS = frozenset({
    "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.startfile",
    "subprocess.Popen", "pty.spawn",
})
# Events that could undo the limits or inspect the hook's state.
_TAMPER_EVENTS = frozenset({
    "resource.setrlimit", "resource.prlimit", "gc.get_referrers", "gc.get_referents", "gc.get_objects",
    "sqlite3.enable_load_extension", "sqlite3.load_extension",
})
# Events whose first argument is a path that is modified (fd arguments refused where noted).
_PATH_EVENTS = frozenset({
    "os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.utime", "os.truncate",
    "os.setxattr", "os.removexattr", "os.chflags", "os.lchflags", "os.lchmod", "os.lchown", "shutil.rmtree",
})
_FD_REFUSED = frozenset({"os.chmod", "os.chown", "os.utime", "os.setxattr", "os.removexattr", "os.chflags"})
_TWO_PATH_EVENTS = frozenset({"os.rename", "os.link", "os.symlink", "shutil.copyfile", "shutil.move"})
_BLOCKED_MODULES = frozenset({"ctypes", "_ctypes", "_posixsubprocess", "cffi", "_cffi_backend"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


class SandboxViolation(PermissionError):
    """Raised inside the sandbox when the code tries something the sandbox forbids."""


class SandboxImportError(ImportError):
    """Raised inside the sandbox for a module the sandbox forbids (``ctypes``)."""


def _make_hook(work: str, own_proc: str, native_suffixes: tuple, allow_processes: bool):
    """Build the audit hook; ``work`` is the only writable directory (real path)."""
    process_events = frozenset() if allow_processes else _PROCESS_EVENTS
    blocked_modules = _BLOCKED_MODULES - {"_posixsubprocess"} if allow_processes else _BLOCKED_MODULES
    realpath, fsdecode, sep, isdir = os.path.realpath, os.fsdecode, os.sep, os.path.isdir
    own_pid, own_pgid = os.getpid(), os.getpgid(0)

    def outside(path) -> bool:
        if isinstance(path, int):
            return False
        real = realpath(fsdecode(path))
        if real == "/dev/null":
            return False
        if real.endswith(native_suffixes):
            return True  # no shared libraries may be written: they could be imported as native code
        return not (real == work or real.startswith(work + sep))

    def outside_dir(path) -> bool:
        return not isinstance(path, int) and isdir(path) and outside(path)

    def foreign_proc(path) -> bool:
        if isinstance(path, int):
            return False
        real = realpath(fsdecode(path))
        if not real.startswith("/proc/"):
            return False
        head = real[6:].split(sep, 1)[0]
        return head.isdigit() and head != own_proc

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            if foreign_proc(path):
                raise SandboxViolation(f"blocked: reading another process ({path!r})")
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (flags or 0) & _WRITE_FLAGS
            if writing and outside(path):
                raise SandboxViolation(f"blocked: write outside the sandbox directory ({path!r})")
            if mode is None and outside_dir(path):
                # a directory fd outside would let dir_fd= relative paths escape the checks above
                raise SandboxViolation(f"blocked: opening a directory outside the sandbox ({path!r})")
        elif event.startswith("socket."):
            raise SandboxViolation(f"blocked: network ({event})")
        elif event in process_events:
            raise SandboxViolation(f"blocked: process creation ({event})")
        elif event == "import":
            if args[0] in blocked_modules:
                raise SandboxImportError(f"blocked: import of {args[0]!r} is not allowed in the sandbox")
        elif event.startswith("ctypes."):
            raise SandboxViolation(f"blocked: native code ({event})")
        elif event in _TAMPER_EVENTS:
            raise SandboxViolation(f"blocked: {event}")
        elif event in ("os.kill", "os.killpg", "signal.pthread_kill"):
            target = args[0]
            if not (event == "os.kill" and target in (own_pid, 0)) and not (event == "os.killpg" and target == own_pgid):
                raise SandboxViolation(f"blocked: signalling another process ({event} {target!r})")
        elif event in _PATH_EVENTS:
            if (event in _FD_REFUSED and isinstance(args[0], int)) or outside(args[0]):
                raise SandboxViolation(f"blocked: write outside the sandbox directory ({event} {args[0]!r})")
        elif event in _TWO_PATH_EVENTS:
            source_counts = event in ("os.rename", "os.link", "shutil.move")
            if (source_counts and outside(args[0])) or outside(args[1]):
                raise SandboxViolation(f"blocked: write outside the sandbox directory ({event} {args[1]!r})")
        elif event == "sqlite3.connect":
            db = args[0]
            if db not in (":memory:", "", b":memory:", b"") and outside(db):
                raise SandboxViolation(f"blocked: write outside the sandbox directory (sqlite3 {db!r})")

    return hook


def _refuse_fork_exec(*args, **kwargs):
    raise SandboxViolation("blocked: process creation (_posixsubprocess.fork_exec)")


def _set_limits(limits: dict) -> None:
    import resource

    cpu = int(limits["cpu_time_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # soft: SIGXCPU, hard: SIGKILL
    pairs = [("RLIMIT_AS", limits["memory_bytes"]), ("RLIMIT_FSIZE", limits["file_size_bytes"]),
             ("RLIMIT_NOFILE", limits["max_open_files"]), ("RLIMIT_CORE", 0)]
    if limits.get("max_processes") is not None:
        pairs.append(("RLIMIT_NPROC", limits["max_processes"]))
    for name, value in pairs:
        resource.setrlimit(getattr(resource, name), (int(value), int(value)))


def _print_user_traceback(exc: BaseException) -> None:
    """Print ``exc`` with only the user's frames (no sandbox internals)."""
    import traceback

    te = traceback.TracebackException.from_exception(exc)
    te.stack = traceback.StackSummary.from_list([f for f in te.stack if f.filename == "<tool_code>"])
    if not te.stack:
        sys.stderr.write("".join(te.format_exception_only()))
    else:
        sys.stderr.write("".join(te.format()))
    sys.stderr.flush()


def _worker(root: str, work: str, limits: dict) -> None:
    """Runs in the forked worker: limits, guards, then the user code. Never returns."""
    import importlib.machinery
    import linecache
    import traceback  # imported before the memory limit bites
    import _posixsubprocess

    allow_processes = bool(limits.get("allow_processes"))
    if not allow_processes:
        _posixsubprocess.fork_exec = _refuse_fork_exec
    with open(os.path.join(root, "main.py"), encoding="utf-8") as f:
        source = f.read()
    os.chdir(work)
    own_proc = os.path.basename(os.path.realpath("/proc/self"))
    _set_limits(limits)
    try:
        code = compile(source, "<tool_code>", "exec")
    except (SyntaxError, ValueError) as exc:
        _print_user_traceback(exc)
        os._exit(1)
    linecache.cache["<tool_code>"] = (len(source), None, source.splitlines(True), "<tool_code>")
    hook = _make_hook(os.path.realpath(work), own_proc, tuple(importlib.machinery.EXTENSION_SUFFIXES),
                      allow_processes)
    sys.addaudithook(hook)
    sys.argv = ["<tool_code>"]
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(code, namespace)
    except SystemExit:
        raise
    except MemoryError:
        os.write(2, b"\nMemoryError: the sandbox memory limit was reached\n")
        os._exit(EXIT_MEMORY)
    except (SandboxViolation, SandboxImportError) as exc:
        _print_user_traceback(exc)
        os._exit(EXIT_BLOCKED)
    except BaseException as exc:
        _print_user_traceback(exc)
        os._exit(1)


def main() -> None:
    """Supervisor: fork the worker, wait for it, report its fate on the status pipe."""
    root, work, status_fd, limits_json = sys.argv[1:5]
    status_fd = int(status_fd)
    limits = json.loads(limits_json)
    pid = os.fork()
    if pid == 0:
        os.close(status_fd)
        try:
            _worker(root, work, limits)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(0)
    _, status, usage = os.wait4(pid, 0)
    cpu = usage.ru_utime + usage.ru_stime
    if os.WIFSIGNALED(status):
        report = f"signal {os.WTERMSIG(status)} {cpu:.3f}"
    else:
        report = f"exit {os.WEXITSTATUS(status)} {cpu:.3f}"
    os.write(status_fd, report.encode())
    os._exit(0)


if __name__ == "__main__":
    main()
