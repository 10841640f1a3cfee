"""The TensorBoard tracker: scalars and text as TensorBoard events, plus everything the stdout tracker does.

View with ``tensorboard --logdir <log_dir>``. The run's config is recorded once as text under ``config``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from roll.tracking.base import Tracker, TrackerOptions, register_tracker, to_float_metrics
from roll.tracking.stdout import StdoutTracker


@dataclasses.dataclass
class TensorboardOptions(TrackerOptions):
    """``tracker_kwargs`` accepted by ``track_with: tensorboard``."""

    log_dir: str | None = dataclasses.field(
        default=None, metadata={"help": "Directory for event files; None = the run's logging_dir."}
    )
    flush_secs: int = dataclasses.field(default=10, metadata={"help": "Seconds between flushes of pending events."})

    def __post_init__(self) -> None:
        if not (isinstance(self.flush_secs, int) and self.flush_secs > 0):
            raise ValueError(f"tracker_kwargs flush_secs={self.flush_secs!r} must be a positive integer (seconds).")


def _as_code_block(text: str) -> str:
    """Wrap ``text`` in a Markdown code fence so TensorBoard keeps its line breaks and spacing."""
    return "```\n" + text + "\n```"


@register_tracker("tensorboard")
class TensorboardTracker(Tracker):
    """Writes scalars with ``torch.utils.tensorboard.SummaryWriter`` and also prints / writes ``metrics.jsonl``.

    Arguments are those of :class:`~roll.tracking.base.Tracker`; ``options`` is a :class:`TensorboardOptions`.
    A resumed run (``run_id`` given) writes new event files into the same directory, which TensorBoard merges;
    :meth:`rewind` makes TensorBoard discard the earlier files' events of the replayed steps (``purge_step``). A new
    run in a directory with event files purges all of theirs (``purge_step=0``), as ``metrics.jsonl`` starts afresh.
    """

    options_cls = TensorboardOptions
    packages = ("tensorboard",)

    def __init__(
        self,
        *,
        exp_name: str,
        log_dir: str,
        config: Mapping[str, Any],
        options: TrackerOptions,
        run_id: str | None = None,
    ) -> None:
        if not isinstance(options, TensorboardOptions):
            raise TypeError(f"TensorboardTracker needs TensorboardOptions, got {type(options).__name__}.")
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:  # torch is always there; the tensorboard package may not be
            raise ImportError(
                "track_with='tensorboard' needs the tensorboard package: pip install tensorboard"
            ) from err
        self.options = options
        self._stdout = StdoutTracker(exp_name=exp_name, log_dir=log_dir, config=config, options=options, run_id=run_id)
        self.event_dir = options.log_dir or log_dir
        self._summary_writer = SummaryWriter
        self._writer = SummaryWriter(
            log_dir=self.event_dir, flush_secs=options.flush_secs, purge_step=0 if run_id is None else None
        )
        if run_id is None and config:
            self._writer.add_text("config", _as_code_block(json.dumps(dict(config), indent=2, default=str)), 0)

    @property
    def run_id(self) -> str:
        """Id of this run (shared with the composed stdout tracker)."""
        return self._stdout.run_id

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Print and record ``metrics`` at ``step``, then add one TensorBoard scalar per key."""
        values = to_float_metrics(metrics)  # converted once: 0-d device tensors sync once
        self._stdout.log(values, step)
        for key, value in values.items():
            self._writer.add_scalar(key, value, global_step=step)

    def log_text(self, key: str, text: str, step: int) -> None:
        """Print ``text`` and add it as a TensorBoard text summary (shown as a code block)."""
        self._stdout.log_text(key, text, step)
        self._writer.add_text(key, _as_code_block(text), global_step=step)

    def rewind(self, step: int) -> None:
        """Drop steps after ``step`` from ``metrics.jsonl``/``texts.jsonl``, and reopen the event writer with
        ``purge_step=step + 1``: TensorBoard then discards the events of later steps in the older event files."""
        self._stdout.rewind(step)
        self._writer.close()
        self._writer = self._summary_writer(
            log_dir=self.event_dir, flush_secs=self.options.flush_secs, purge_step=step + 1
        )

    def finish(self) -> None:
        """Flush and close the event writer and the stdout tracker."""
        self._writer.close()
        self._stdout.finish()
