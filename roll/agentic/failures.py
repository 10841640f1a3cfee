"""What a rollout records when a user's env or agent harness fails, and the once-per-step report of it.

An env call that raises, hangs past ``env_step_timeout`` or returns a non-finite reward ends its trajectory (an
agent harness: raises, runs past ``agent_timeout``, returns a non-finite reward or never calls the model); the
trajectory keeps ``failure`` (one line: the call, the exception's type and whole message, each chained cause's type
and message, and the ``file:line`` that raised: :func:`describe`), ``failure_kind`` (``"error"`` or ``"timeout"``),
``failure_type`` (the exception's class name, ``"Timeout"`` or ``"NonFiniteReward"``), ``failure_at``,
``failure_turn`` (the number of model turns before the failure) and ``failure_traceback`` (the whole traceback, for
the dumps and the error log). :func:`failure_report` folds a step's failed trajectories into one log line per
distinct failure and ``{prefix}/env_errors/<type>`` counts; a rollout left with nothing to train on stops the run
with :class:`RolloutFailed` (one line; the tracebacks go to the run's error log).
"""

from __future__ import annotations

import sys
import sysconfig
import traceback
from collections import Counter

from roll.data.trajectory import Trajectory
from roll.errors import RunStopped

_LIBRARY_DIRS = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")})


def raised_at(exc: BaseException) -> str | None:
    """``file:line in function`` of the deepest traceback frame outside the standard library and installed
    packages (the user's own code), else of the deepest frame; None without a traceback."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return None
    own = [f for f in frames if not f.filename.startswith(_LIBRARY_DIRS) and "/roll/agentic/" not in f.filename]
    frame = (own or frames)[-1]
    return f"{frame.filename}:{frame.lineno} in {frame.name}"


def record_failure(traj: Trajectory, kind: str, type_name: str, message: str, at: str | None = None) -> None:
    """End ``traj`` as failed (see the module docstring for the fields)."""
    traj.failure = message + (f" (at {at})" if at else "")
    traj.failure_kind, traj.failure_type, traj.failure_at = kind, type_name, at
    traj.failure_turn = len(traj.turns)


#: Longest ``failure`` line (characters), the location excepted.
MAX_FAILURE = 1000


def exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from (``raise ... from``) or during (an implicit context)."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not e for e in chain):
        chain.append(current)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return chain


def describe(exc: BaseException) -> str:
    """One line: ``Type: message`` of ``exc`` (its lines joined), then `` <- Type: message`` for each cause in its
    chain; a cause whose message an outer one already shows is named by its type only.

    >>> try:
    ...     try:
    ...         raise ValueError("400 - tool_choice='required' is not supported")
    ...     except ValueError as e:
    ...         raise RuntimeError("Error while generating output:\\n" + str(e)) from e
    ... except RuntimeError as err:
    ...     print(describe(err))
    RuntimeError: Error while generating output: 400 - tool_choice='required' is not supported <- ValueError
    """
    parts, shown = [], ""
    for e in exception_chain(exc):
        text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
        parts.append(type(e).__name__ if not text or text in shown else f"{type(e).__name__}: {text}")
        shown += " " + text
    return " <- ".join(parts)


def record_error(traj: Trajectory, call: str, exc: BaseException) -> None:
    """End ``traj`` with the exception ``exc`` raised by env call ``call`` (e.g. ``"env.step"``, ``"agent.run"``):
    the whole chain on the one line (:func:`describe`), the whole traceback in ``failure_traceback``."""
    record_failure(traj, "error", type(exc).__name__, f"{call}: {describe(exc)}"[:MAX_FAILURE], raised_at(exc))
    traj.failure_traceback = "".join(traceback.format_exception(exc))


class RolloutFailed(RunStopped):
    """A rollout left nothing to train on: the message is the one-line summary (what failed, the fix that fits);
    ``details`` holds the tracebacks of its distinct failures, which the pipeline writes to the run's error log."""

    def __init__(self, message: str, details: str = ""):
        super().__init__(message)
        self.details = details


def failure_details(trajectories: list[Trajectory]) -> str:
    """The first trajectory of each distinct failure (:func:`distinct`) with its traceback, for the error log."""
    first: dict[tuple, Trajectory] = {}
    for t in trajectories:
        if t.failure:
            first.setdefault(distinct(t), t)
    return "\n".join(
        f"{t.failure} (env tag {t.tag!r}, seed {t.seed}, turn {t.failure_turn}, id {t.traj_id})\n"
        + (t.failure_traceback or "(no traceback: the call did not raise)\n")
        for t in first.values()
    )


def distinct(traj: Trajectory) -> tuple:
    """What makes failures the same: type and raising line (the message where no line is known, e.g. timeouts)."""
    return (traj.failure_kind, traj.failure_type, traj.failure_at or traj.failure)


def failure_report(
    trajectories: list[Trajectory], phase: str, step: int, prefix: str, max_lines: int = 10
) -> tuple[list[str], dict[str, float]]:
    """One line per distinct failure (:func:`distinct`) with how many trajectories it ended and the message, tag,
    seed and turn of its first occurrence, plus ``{prefix}/env_errors/<type>`` counts."""
    failed = [t for t in trajectories if t.failure]
    counts = Counter(t.failure_type or "Unknown" for t in failed)
    metrics = {f"{prefix}/env_errors/{name}": float(n) for name, n in counts.items()}
    first: dict[tuple, Trajectory] = {}
    seen: Counter = Counter()
    for t in failed:
        key = distinct(t)
        first.setdefault(key, t)
        seen[key] += 1
    lines = [
        f"[roll] {phase} step {step}: {seen[key]} trajectories failed: {t.failure} (first: env tag {t.tag!r}, "
        f"seed {t.seed}, turn {t.failure_turn}, id {t.traj_id})"
        for key, t in list(first.items())[:max_lines]
    ]
    if len(first) > max_lines:
        lines.append(
            f"[roll] {phase} step {step}: {len(first) - max_lines} more distinct failures (see the "
            f"trajectory dumps and {prefix}/env_errors/*)"
        )
    return lines, metrics


def print_lines(lines: list[str]) -> None:
    """Print report lines in one write (so lines of parallel processes do not interleave)."""
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
