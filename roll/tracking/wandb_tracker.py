"""The Weights & Biases tracker: a W&B run, plus everything the stdout tracker does.

``wandb`` is imported only when this tracker is created. Set ``WANDB_MODE=offline`` (or
``tracker_kwargs: {mode: offline}``) to log locally with no network; upload later with ``wandb sync``.
Resuming: pass the ``run_id`` saved in the checkpoint and the same W&B run continues (``resume="allow"``). W&B
keeps a run's steps increasing: a replayed step that the run already holds is ignored (not duplicated), one the
killed process never sent is recorded.
"""

from __future__ import annotations

import dataclasses
import html
import os
from collections.abc import Mapping
from typing import Any, Literal, get_args

from roll.tracking.base import Tracker, TrackerOptions, register_tracker, to_float_metrics
from roll.tracking.stdout import StdoutTracker

WandbMode = Literal["online", "offline", "disabled"]


@dataclasses.dataclass
class WandbOptions(TrackerOptions):
    """``tracker_kwargs`` accepted by ``track_with: wandb`` (passed to ``wandb.init``)."""

    project: str = dataclasses.field(default="roll", metadata={"help": "W&B project."})
    name: str | None = dataclasses.field(default=None, metadata={"help": "Run name; None = exp_name."})
    dir: str | None = dataclasses.field(
        default=None, metadata={"help": "Parent of the local 'wandb/' folder; None = the run's logging_dir."}
    )
    entity: str | None = dataclasses.field(default=None, metadata={"help": "W&B user or team; None = default."})
    group: str | None = dataclasses.field(default=None, metadata={"help": "Group runs together in the W&B UI."})
    tags: list[str] = dataclasses.field(default_factory=list, metadata={"help": "Run tags."})
    notes: str | None = dataclasses.field(default=None, metadata={"help": "Free-text run description."})
    mode: WandbMode | None = dataclasses.field(
        default=None,
        metadata={"help": "'online', 'offline' or 'disabled'; None = the WANDB_MODE variable or W&B's default."},
    )

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in get_args(WandbMode):
            raise ValueError(
                f"tracker_kwargs mode={self.mode!r} is not a W&B mode; use one of {list(get_args(WandbMode))} "
                "or leave it unset to follow WANDB_MODE."
            )


def _import_wandb() -> Any:
    """Import ``wandb`` or say how to install it."""
    try:
        import wandb
    except ImportError as err:
        raise ImportError("track_with='wandb' needs the wandb package: pip install wandb") from err
    return wandb


@register_tracker("wandb")
class WandbTracker(Tracker):
    """Logs to a W&B run and also prints / writes ``metrics.jsonl``.

    Arguments are those of :class:`~roll.tracking.base.Tracker`; ``options`` is a :class:`WandbOptions`.
    The run id is W&B's own id (the one given when resuming).
    """

    options_cls = WandbOptions
    packages = ("wandb",)

    def __init__(
        self,
        *,
        exp_name: str,
        log_dir: str,
        config: Mapping[str, Any],
        options: TrackerOptions,
        run_id: str | None = None,
    ) -> None:
        if not isinstance(options, WandbOptions):
            raise TypeError(f"WandbTracker needs WandbOptions, got {type(options).__name__}.")
        self.options = options
        self._wandb = _import_wandb()
        wandb_dir = options.dir or log_dir
        os.makedirs(wandb_dir, exist_ok=True)
        self._run = self._wandb.init(
            project=options.project,
            name=options.name or exp_name,
            dir=wandb_dir,
            entity=options.entity,
            group=options.group,
            tags=options.tags or None,
            notes=options.notes,
            mode=options.mode,
            config=dict(config),
            id=run_id,
            resume="allow" if run_id else None,
            reinit="finish_previous",
        )
        self.run_dir: str = self._run.dir
        self._finished = False
        # The stdout part prints W&B's run id, the one to resume with.
        self._stdout = StdoutTracker(
            exp_name=exp_name,
            log_dir=log_dir,
            config=config,
            options=options,
            run_id=self._run.id,
            resume=run_id is not None,
        )

    @property
    def run_id(self) -> str:
        """The W&B run id."""
        return str(self._run.id)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Print and record ``metrics`` at ``step``, then log them to the W&B run at that step."""
        values = to_float_metrics(metrics)  # converted once: 0-d device tensors sync once
        self._stdout.log(values, step)
        self._run.log(values, step=step)

    def log_text(self, key: str, text: str, step: int) -> None:
        """Print ``text`` and log it to W&B as preformatted HTML."""
        self._stdout.log_text(key, text, step)
        self._run.log({key: self._wandb.Html(f"<pre>{html.escape(text)}</pre>")}, step=step)

    def rewind(self, step: int) -> None:
        """Drop steps after ``step`` from ``metrics.jsonl``/``texts.jsonl``. The W&B run itself is not rewound
        (W&B's ``resume_from`` is a beta server feature): it ignores replayed steps it already holds."""
        self._stdout.rewind(step)

    def finish(self) -> None:
        """Finish the W&B run (idempotent) and close the stdout tracker."""
        if not self._finished:
            self._run.finish()
            self._finished = True
        self._stdout.finish()
