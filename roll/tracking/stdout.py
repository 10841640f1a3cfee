"""The stdout tracker: one compact line per step, plus ``metrics.jsonl`` for plots and later analysis.

Line format (headline keys first in their given order, then the other keys sorted)::

    step 3 | rollout/success_rate 0.3125 | rollout/mean_reward -0.41 | actor/pg_loss 0.0123 | ...

File format: ``<log_dir>/metrics.jsonl`` gets one JSON object per :meth:`StdoutTracker.log` call,
``{"step": 3, "timestamp": 1763740000.0, "rollout/success_rate": 0.3125, ...}``; NaN and infinite values are
written as ``null``. A new run (``run_id=None``) starts the file afresh; a resumed run appends to it after
:meth:`StdoutTracker.rewind` dropped the records of the steps it replays, so each step is logged once (one step may
have several records, e.g. training and validation metrics; readers merge them, see
:func:`roll.tracking.plot.load_metrics`).
Text from :meth:`StdoutTracker.log_text` is printed and appended to ``<log_dir>/texts.jsonl``.

Lines are printed through ``tqdm.write`` so that they appear above an active progress bar instead of breaking it.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Iterable, Mapping
from typing import IO, Any

from tqdm import tqdm

from roll.tracking.base import Tracker, TrackerOptions, json_safe, new_run_id, register_tracker, to_float_metrics
from roll.tracking.rewind import truncate_jsonl

METRICS_FILE = "metrics.jsonl"
TEXTS_FILE = "texts.jsonl"
RESERVED_KEYS = ("step", "timestamp")


def format_value(value: float) -> str:
    """A float with 4 significant digits: ``0.31249 -> '0.3125'``, ``-0.41 -> '-0.41'``, ``12.0 -> '12'``."""
    if math.isnan(value):
        return "nan"
    return f"{value:.4g}"


def order_keys(keys: Iterable[str], headline_keys: Iterable[str]) -> list[str]:
    """``keys`` ordered with the present ``headline_keys`` first (in their order), then the rest sorted."""
    keys = list(keys)
    present = set(keys)
    head = [k for k in dict.fromkeys(headline_keys) if k in present]
    head_set = set(head)
    return head + sorted(k for k in keys if k not in head_set)


def format_metrics_line(step: int, metrics: Mapping[str, float], headline_keys: Iterable[str] = ()) -> str:
    """The stdout line of one step: ``"step 3 | rollout/success_rate 0.3125 | ..."``."""
    parts = [f"step {step}"]
    parts += [f"{key} {format_value(metrics[key])}" for key in order_keys(metrics, headline_keys)]
    return " | ".join(parts)


@register_tracker("stdout")
class StdoutTracker(Tracker):
    """Prints one line per step and appends every step's metrics to ``<log_dir>/metrics.jsonl``.

    Always active: the TensorBoard and W&B trackers hold one of these. Arguments are those of
    :class:`~roll.tracking.base.Tracker`; ``stream`` overrides where lines go (default: ``sys.stdout`` at each
    write, so redirections made later are honoured). ``resume`` says whether to append to an existing
    ``metrics.jsonl`` (default: when ``run_id`` is given); a backend that owns the run id passes both.
    """

    options_cls = TrackerOptions

    def __init__(
        self,
        *,
        exp_name: str,
        log_dir: str,
        config: Mapping[str, Any],
        options: TrackerOptions,
        run_id: str | None = None,
        stream: IO[str] | None = None,
        resume: bool | None = None,
    ) -> None:
        self.exp_name = exp_name
        self.log_dir = log_dir
        self.options = options
        self.headline_keys = list(options.headline_keys)
        self._run_id = run_id or new_run_id()
        self._stream = stream
        os.makedirs(log_dir, exist_ok=True)
        resuming = run_id is not None if resume is None else resume
        mode = "a" if resuming else "w"  # resume appends; a new run starts the file afresh
        self.metrics_path = os.path.join(log_dir, METRICS_FILE)
        self.texts_path = os.path.join(log_dir, TEXTS_FILE)
        self._mode = mode
        self._metrics_file: IO[str] | None = open(self.metrics_path, mode, encoding="utf-8")
        self._texts_file: IO[str] | None = None  # opened by the first log_text
        verb = "resuming" if resuming else "starting"
        self._write(f"tracking: {verb} run {self._run_id} of {exp_name!r}, metrics -> {self.metrics_path}")

    @property
    def run_id(self) -> str:
        """Id of this run (given at construction when resuming, else freshly generated)."""
        return self._run_id

    def _write(self, line: str) -> None:
        tqdm.write(line, file=self._stream or sys.stdout)

    def _check_open(self, what: str) -> None:
        if self._metrics_file is None:
            raise RuntimeError(f"{what} called after finish() on tracker run {self._run_id}; create a new tracker.")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Print the step's line and append ``{"step", "timestamp", **metrics}`` to ``metrics.jsonl``.

        Raises:
            ValueError: a metric is named ``step`` or ``timestamp`` (reserved for the record itself).
            TypeError: a value is not a scalar.
        """
        self._check_open("log")
        values = to_float_metrics(metrics)
        clash = [k for k in RESERVED_KEYS if k in values]
        if clash:
            raise ValueError(f"metric keys {clash} are reserved in metrics.jsonl; rename them, e.g. 'time/{clash[0]}'.")
        record: dict[str, Any] = {"step": int(step), "timestamp": round(time.time(), 3)}
        record.update({k: json_safe(v) for k, v in values.items()})
        assert self._metrics_file is not None
        self._metrics_file.write(json.dumps(record) + "\n")
        self._metrics_file.flush()
        self._write(format_metrics_line(step, values, self.headline_keys))

    def log_text(self, key: str, text: str, step: int) -> None:
        """Print ``text`` under a ``step N | key:`` header and append it to ``texts.jsonl``."""
        self._check_open("log_text")
        if self._texts_file is None:
            self._texts_file = open(self.texts_path, self._mode, encoding="utf-8")
        self._texts_file.write(json.dumps({"step": int(step), "key": key, "text": text}) + "\n")
        self._texts_file.flush()
        self._write(f"step {step} | {key}:\n{text}")

    def rewind(self, step: int) -> None:
        """Drop the records of steps after ``step`` from ``metrics.jsonl`` and ``texts.jsonl`` (and a line torn by
        a kill), then keep appending."""
        self._check_open("rewind")
        for attr, path in (("_metrics_file", self.metrics_path), ("_texts_file", self.texts_path)):
            handle = getattr(self, attr)
            if handle is not None:
                handle.close()
            dropped = truncate_jsonl(path, step)
            if dropped:
                self._write(f"tracking: dropped {dropped} record(s) after step {step} from {path} (replayed now)")
            if handle is not None:
                setattr(self, attr, open(path, "a", encoding="utf-8"))
        self._mode = "a"

    def finish(self) -> None:
        """Close ``metrics.jsonl`` and ``texts.jsonl``; later calls do nothing."""
        for f in (self._metrics_file, self._texts_file):
            if f is not None:
                f.close()
        self._metrics_file = self._texts_file = None
