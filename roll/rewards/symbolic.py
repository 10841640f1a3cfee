"""Symbolic answer comparison with math-verify, in a child process that is killed on timeout.

Why a process: sympy (under math-verify) can run for minutes on adversarial input such as ``10^{10^{10}}``,
partly inside C code that no signal interrupts, and math-verify's own ``signal.alarm`` timeout only works in a
process's main thread (not in Ray actor threads or thread pools). A persistent child process answers requests
over pipes; a request that exceeds its time limit kills the child, counts as "no match", and the next request
starts a fresh child. Start-up (importing sympy, ~1 s) is not counted against the per-call limit.
Unix only (uses ``select`` on pipes).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

_SERVER = Path(__file__).with_name("_verify_server.py")
_STARTUP_TIMEOUT_S = 120.0


class SymbolicVerifier:
    """A math-verify child process with a per-call time limit. Thread-safe (calls are serialized)."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self._lock = threading.Lock()
        self.timeouts = 0  # number of calls that hit their limit (a metric for callers)

    def _start(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, str(_SERVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
        )
        self._proc, self._buffer = proc, b""
        ready = self._read_line(_STARTUP_TIMEOUT_S)
        if ready is None or not json.loads(ready).get("ready"):
            self.close()
            raise RuntimeError(
                "the math-verify child process did not start; check that `math-verify` is installed "
                f"(pip install math-verify) for {sys.executable}"
            )
        return proc

    def _read_line(self, timeout_s: float) -> bytes | None:
        """Read one line from the child, or return None on timeout or if the child died."""
        assert self._proc is not None and self._proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def close(self) -> None:
        """Kill the child process (a later call starts a new one)."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for stream in (self._proc.stdin, self._proc.stdout):
                if stream is not None:
                    stream.close()
            self._proc = None

    def equivalent(self, pred: str, truth: str, timeout_s: float = 1.0) -> bool:
        """Whether math-verify finds ``pred`` equal to ``truth`` within ``timeout_s`` seconds.

        A timeout, a parser error or a crashed child all count as no match; the caller never hangs longer
        than ``timeout_s`` (plus child start-up when no child is running).
        """
        with self._lock:
            proc = self._proc if self._proc is not None and self._proc.poll() is None else self._start()
            assert proc.stdin is not None
            try:
                proc.stdin.write(json.dumps({"pred": pred, "truth": truth}).encode() + b"\n")
            except BrokenPipeError:
                self.close()
                return False
            line = self._read_line(timeout_s)
            if line is None:
                self.timeouts += 1
                self.close()
                return False
            return bool(json.loads(line).get("match", False))

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the child also exits when its stdin closes
            pass


_DEFAULT: SymbolicVerifier | None = None
_DEFAULT_LOCK = threading.Lock()


def symbolic_equivalent(pred: str, truth: str, timeout_s: float = 1.0) -> bool:
    """Compare with the process-wide :class:`SymbolicVerifier` (created on first use)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = SymbolicVerifier()
    return _DEFAULT.equivalent(pred, truth, timeout_s)
