"""Runs as the sandbox process (``python -I -S _bootstrap.py ROOT WORK STATUS_FD LIMITS_JSON``).

Not imported by roll: :mod:`roll.envs.tool_use.sandbox` starts this file as a script. Standard library only.

Layout: this process is a *supervisor* (PID 1 when a PID namespace is available) that forks one
*worker*. The worker lowers its resource limits, reads the user code, closes every inherited file descriptor
but 0-2, patches the raw process-creation primitive, installs an audit hook (which cannot be removed for the life
of the interpreter) and runs the code. When the kernel has Landlock, this process was started by ``_landlock.py``
and the kernel already confines its reads and writes to the same paths the hook allows (the hook is the second
layer). The supervisor waits for the worker and reports ``exit N`` or ``signal N`` plus the worker's CPU
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
_PROCESS_EVENTS = frozenset(
    {
        "os.fork",
        "os.forkpty",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.system",
        "os.startfile",
        "subprocess.Popen",
        "pty.spawn",
    }
)
# Events that could undo the limits or inspect the hook's state.
_TAMPER_EVENTS = frozenset(
    {
        "resource.setrlimit",
        "resource.prlimit",
        "gc.get_referrers",
        "gc.get_referents",
        "gc.get_objects",
        "sqlite3.enable_load_extension",
        "sqlite3.load_extension",
    }
)
# Events whose first argument is a path that is modified (fd arguments refused where noted).
_PATH_EVENTS = frozenset(
    {
        "os.remove",
        "os.rmdir",
        "os.mkdir",
        "os.chmod",
        "os.chown",
        "os.utime",
        "os.truncate",
        "os.setxattr",
        "os.removexattr",
        "os.chflags",
        "os.lchflags",
        "os.lchmod",
        "os.lchown",
        "shutil.rmtree",
    }
)
_FD_REFUSED = frozenset({"os.chmod", "os.chown", "os.utime", "os.setxattr", "os.removexattr", "os.chflags"})
_TWO_PATH_EVENTS = frozenset({"os.rename", "os.link", "os.symlink", "shutil.copyfile", "shutil.move"})
_BLOCKED_MODULES = frozenset({"ctypes", "_ctypes", "_posixsubprocess", "cffi", "_cffi_backend"})
# Modules that read files in C, past the "open" audit event: user databases (pwd.getpwall reads /etc/passwd),
# readline.read_history_file (any text file), Tcl's `open`, dbm files, certificate files (no network anyway).
_FILE_READING_MODULES = frozenset({"pwd", "grp", "spwd", "nis", "readline", "_tkinter", "_dbm", "_gdbm", "_ssl"})
# Events whose first argument is a path (or fd) that is read or listed.
_READ_EVENTS = frozenset({"os.listdir", "os.scandir", "os.listxattr", "os.getxattr"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_FILE_EVENTS = frozenset({"open", "os.chdir", "sqlite3.connect"}) | _READ_EVENTS | _PATH_EVENTS | _TWO_PATH_EVENTS


class SandboxViolation(PermissionError):
    """Raised inside the sandbox when the code tries something the sandbox forbids."""


class SandboxImportError(ImportError):
    """Raised inside the sandbox for a module the sandbox forbids (``ctypes``)."""


class _PathRules:
    """Where the code may write (``work``) and read (``work``, ``read_paths``, its own ``/proc`` entry), as real
    paths, and the checks of the file events against them."""

    def __init__(self, work: str, own_proc: str, native_suffixes: tuple, read_paths: list) -> None:
        self.work, self.own_proc, self.native_suffixes = work, own_proc, native_suffixes
        self.files = frozenset(read_paths)
        self.trees = tuple(p + os.sep for p in read_paths) + (work + os.sep, f"/proc/{own_proc}{os.sep}")
        self.dir_fds = False  # the code opened a directory descriptor (possible only inside work)

    def outside(self, path) -> bool:
        """Not writable: outside ``work`` (``/dev/null`` excepted), or a shared library anywhere."""
        if isinstance(path, int):
            return False
        real = os.path.realpath(os.fsdecode(path))
        if real == "/dev/null":
            return False
        if real.endswith(self.native_suffixes):
            return True  # no shared libraries may be written: they could be imported as native code
        return not (real == self.work or real.startswith(self.work + os.sep))

    def foreign_proc(self, path) -> bool:
        """Another process's ``/proc`` entry (the caller's environment lives there)."""
        if isinstance(path, int):
            return False
        real = os.path.realpath(os.fsdecode(path))
        head = real[6:].split(os.sep, 1)[0]
        return real.startswith("/proc/") and head.isdigit() and head != self.own_proc

    def unreadable(self, path) -> bool:
        """Outside the readable paths (descriptors pass: 3+ were closed before the code ran, so any other came
        through these checks)."""
        if isinstance(path, int):
            return False
        real = os.path.realpath(os.fsdecode(path))
        return not (real in self.files or real == self.work or real.startswith(self.trees))

    def climbs(self, path) -> bool:
        """A relative path leaving its start directory once the code holds a directory descriptor: the hook cannot
        see a ``dir_fd=`` base, so it would check such a path against the wrong directory."""
        if isinstance(path, int) or not self.dir_fds:
            return False
        text = os.fsdecode(path)
        return not text.startswith(os.sep) and os.path.normpath(text).split(os.sep)[0] == ".."

    def violation(self, event: str, args: tuple) -> str | None:
        """Why file event ``event`` is refused, or None."""
        if event == "open":
            return self._open(*args)
        if event in _READ_EVENTS:
            path = "." if args[0] is None else args[0]
            if self.foreign_proc(path) or self.unreadable(path) or self.climbs(path):
                return f"blocked: reading outside the sandbox ({event} {args[0]!r})"
        elif event == "os.chdir" and self.outside(args[0]):
            return f"blocked: changing directory outside the sandbox ({args[0]!r})"
        elif event in _PATH_EVENTS:
            if (event in _FD_REFUSED and isinstance(args[0], int)) or self.outside(args[0]):
                return f"blocked: write outside the sandbox directory ({event} {args[0]!r})"
        elif event in _TWO_PATH_EVENTS:
            source_counts = event in ("os.rename", "os.link", "shutil.move")
            if (source_counts and self.outside(args[0])) or self.outside(args[1]):
                return f"blocked: write outside the sandbox directory ({event} {args[1]!r})"
            if (
                event == "os.symlink"
                and not isinstance(args[1], int)
                and self.unreadable(os.path.join(os.path.dirname(os.fsdecode(args[1])), os.fsdecode(args[0])))
            ):
                return f"blocked: symlink to a path outside the sandbox ({args[0]!r})"
        elif event == "sqlite3.connect":
            db = args[0]
            if db not in (":memory:", "", b":memory:", b"") and (
                self.outside(db) or os.fsdecode(db).startswith("file:")
            ):
                return f"blocked: write outside the sandbox directory (sqlite3 {db!r})"
        return None

    def _open(self, path, mode, flags) -> str | None:
        if self.foreign_proc(path):
            return f"blocked: reading another process ({path!r})"
        if self.climbs(path):
            return f"blocked: relative path climbing out of a directory descriptor ({path!r})"
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (flags or 0) & _WRITE_FLAGS
        if writing and self.outside(path):
            return f"blocked: write outside the sandbox directory ({path!r})"
        is_dir = mode is None and not isinstance(path, int) and os.path.isdir(path)
        if is_dir and self.outside(path):
            # a directory fd outside would let dir_fd= relative paths escape the checks above
            return f"blocked: opening a directory outside the sandbox ({path!r})"
        if self.unreadable(path):
            return f"blocked: reading outside the sandbox ({path!r})"
        self.dir_fds = self.dir_fds or is_dir
        return None


def _make_hook(work: str, own_proc: str, native_suffixes: tuple, allow_processes: bool, read_paths: list):
    """Build the audit hook; ``work`` is the only writable directory, ``read_paths`` (and ``work``) the only
    readable ones (real paths)."""
    process_events = frozenset() if allow_processes else _PROCESS_EVENTS
    blocked_modules = (
        _BLOCKED_MODULES - {"_posixsubprocess"} if allow_processes else _BLOCKED_MODULES
    ) | _FILE_READING_MODULES
    rules = _PathRules(work, own_proc, native_suffixes, read_paths)
    own_pid, own_pgid = os.getpid(), os.getpgid(0)

    def hook(event: str, args: tuple) -> None:
        if event in _FILE_EVENTS:
            reason = rules.violation(event, args)
            if reason:
                raise SandboxViolation(reason)
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
            if not (event == "os.kill" and target in (own_pid, 0)) and not (
                event == "os.killpg" and target == own_pgid
            ):
                raise SandboxViolation(f"blocked: signalling another process ({event} {target!r})")

    return hook


def _refuse_fork_exec(*args, **kwargs):
    raise SandboxViolation("blocked: process creation (_posixsubprocess.fork_exec)")


def _set_limits(limits: dict) -> None:
    import resource

    cpu = int(limits["cpu_time_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # soft: SIGXCPU, hard: SIGKILL
    pairs = [
        ("RLIMIT_AS", limits["memory_bytes"]),
        ("RLIMIT_FSIZE", limits["file_size_bytes"]),
        ("RLIMIT_NOFILE", limits["max_open_files"]),
        ("RLIMIT_CORE", 0),
    ]
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
    import _posixsubprocess
    import importlib.machinery
    import linecache

    allow_processes = bool(limits.get("allow_processes"))
    if not allow_processes:
        _posixsubprocess.fork_exec = _refuse_fork_exec
    with open(os.path.join(root, "main.py"), encoding="utf-8") as f:
        source = f.read()
    os.closerange(3, 1 << 20)  # no descriptor of the caller's reaches the code (close_range: one syscall)
    os.chdir(work)
    own_proc = os.path.basename(os.path.realpath("/proc/self"))
    _set_limits(limits)
    try:
        code = compile(source, "<tool_code>", "exec")
    except (SyntaxError, ValueError) as exc:
        _print_user_traceback(exc)
        os._exit(1)
    linecache.cache["<tool_code>"] = (len(source), None, source.splitlines(True), "<tool_code>")
    hook = _make_hook(
        os.path.realpath(work),
        own_proc,
        tuple(importlib.machinery.EXTENSION_SUFFIXES),
        allow_processes,
        list(limits["read_paths"]),
    )
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
