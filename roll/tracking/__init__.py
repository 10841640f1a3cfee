"""Experiment tracking: stdout / TensorBoard / W&B trackers behind one interface, progress bar, result plots.

Typical use in a pipeline::

    tracker = make_tracker(cfg.track_with, exp_name=cfg.exp_name, log_dir=cfg.logging_dir,
                           config=cfg_dict, tracker_kwargs=cfg.tracker_kwargs, run_id=ckpt_run_id)
    tracker.log({"rollout/success_rate": 0.31, "actor/pg_loss": 0.02}, step=3)
    tracker.finish()

Importing this package registers the built-in trackers; ``wandb`` and TensorBoard load only when used.
"""

from roll.tracking import tensorboard_tracker as _tensorboard_tracker  # noqa: F401  (registers "tensorboard")
from roll.tracking import wandb_tracker as _wandb_tracker  # noqa: F401  (registers "wandb")
from roll.tracking.base import (
    DEFAULT_HEADLINE_KEYS,
    TRACKERS,
    Tracker,
    TrackerOptions,
    get_tracker_class,
    list_trackers,
    make_tracker,
    register_tracker,
)
from roll.tracking.progress import Progress, progress
from roll.tracking.stdout import StdoutTracker, format_metrics_line, format_value
from roll.tracking.tensorboard_tracker import TensorboardOptions, TensorboardTracker
from roll.tracking.wandb_tracker import WandbOptions, WandbTracker

__all__ = [
    "DEFAULT_HEADLINE_KEYS",
    "TRACKERS",
    "Progress",
    "StdoutTracker",
    "TensorboardOptions",
    "TensorboardTracker",
    "Tracker",
    "TrackerOptions",
    "WandbOptions",
    "WandbTracker",
    "format_metrics_line",
    "format_value",
    "get_tracker_class",
    "list_trackers",
    "make_tracker",
    "progress",
    "register_tracker",
]
