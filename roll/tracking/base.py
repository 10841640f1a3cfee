"""The tracker interface, its registry and :func:`make_tracker`.

A tracker receives one flat dict of scalar metrics per training step (keys are ``component/name``, e.g.
``rollout/success_rate``) and sends it somewhere: stdout, TensorBoard, Weights & Biases. Every tracker prints one
line per step to stdout and appends the step's metrics to ``<log_dir>/metrics.jsonl`` (what
:mod:`roll.tracking.plot` reads), because the TensorBoard and W&B trackers compose a
:class:`~roll.tracking.stdout.StdoutTracker`.

Backends register in :data:`TRACKERS` with ``@register_tracker("name")`` and declare their options as a dataclass
(``options_cls``); :func:`make_tracker` builds that dataclass from the config's ``tracker_kwargs`` and rejects
unknown keys with a message that lists the accepted ones.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, ClassVar, TypeVar

from roll.registry import Registry

#: Keys printed first on the stdout line and shown in the progress bar postfix, in this order.
DEFAULT_HEADLINE_KEYS: tuple[str, ...] = (
    "rollout/success_rate",
    "rollout/mean_reward",
    "val/success_rate",
    "actor/pg_loss",
    "time/step",
)


@dataclasses.dataclass
class TrackerOptions:
    """Options every tracker accepts (the stdout part that all trackers share)."""

    headline_keys: list[str] = dataclasses.field(
        default_factory=lambda: list(DEFAULT_HEADLINE_KEYS),
        metadata={"help": "Keys printed first on each stdout line, in this order; the rest follow sorted."},
    )


class Tracker(ABC):
    """Sends per-step scalar metrics (and optional text) to one logging backend.

    Subclasses set ``options_cls`` to a :class:`TrackerOptions` subclass and accept the keyword arguments of
    :meth:`__init__`. A tracker is also a context manager that calls :meth:`finish` on exit.

    Args:
        exp_name: experiment name (used as the run name where the backend has one).
        log_dir: directory for ``metrics.jsonl`` and the backend's local files; created if missing.
        config: the run's full config as a plain dict (recorded by backends that store configs).
        options: backend options, an instance of ``options_cls``.
        run_id: id of the run to continue (from a checkpoint); ``None`` starts a new run.
    """

    options_cls: ClassVar[type[TrackerOptions]] = TrackerOptions
    #: pip distributions the tracker needs (checked by ``roll doctor``).
    packages: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def __init__(
        self,
        *,
        exp_name: str,
        log_dir: str,
        config: Mapping[str, Any],
        options: TrackerOptions,
        run_id: str | None = None,
    ) -> None:
        """Open the backend run (see the class docstring for the arguments)."""

    @property
    @abstractmethod
    def run_id(self) -> str:
        """Id of this run; store it in checkpoints and pass it back to :func:`make_tracker` to resume."""

    @abstractmethod
    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record scalar ``metrics`` (``{"component/name": value}``) at training step ``step``.

        Values may be Python numbers, NumPy scalars or 0-d tensors; anything ``float()`` accepts.
        Several calls with the same step are allowed (e.g. validation metrics logged separately).
        """

    @abstractmethod
    def log_text(self, key: str, text: str, step: int) -> None:
        """Record a piece of text (e.g. a sample trajectory) under ``key`` at ``step``."""

    @abstractmethod
    def finish(self) -> None:
        """Flush and close the run. Calling it twice is harmless; logging after it is an error."""

    def rewind(self, step: int) -> None:
        """Forget what this run logged after ``step``: a resume from the step-``step`` checkpoint replays those
        steps, and each must be logged once. Trackers whose backend keeps a step history override this (the
        built-in ones all do); the default keeps everything."""

    def __enter__(self) -> Tracker:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.finish()


def new_run_id() -> str:
    """A fresh run id: 8 lowercase hex characters (W&B accepts the same format)."""
    return uuid.uuid4().hex[:8]


def to_float_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Convert every value to ``float`` (NumPy scalars and 0-d tensors included), keeping the key order.

    Raises:
        TypeError: a key is not a string or a value cannot be converted to a float.
    """
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if not isinstance(key, str):
            raise TypeError(f"metric key {key!r} is a {type(key).__name__}; keys must be strings like 'actor/pg_loss'.")
        try:
            out[key] = float(value)
        except (TypeError, ValueError) as err:
            raise TypeError(
                f"metric {key!r} has value {value!r} of type {type(value).__name__}, which is not a scalar; "
                "log numbers only (reduce tensors with .mean().item(), send text through log_text)."
            ) from err
    return out


def as_plain_dict(obj: Any, what: str = "config") -> dict[str, Any]:
    """A plain ``dict`` (nested lists and dicts only) from a mapping, a dataclass or an OmegaConf config.

    Raises:
        TypeError: ``obj`` is none of these; ``what`` names the argument in the message.
    """
    if obj is None:
        return {}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if type(obj).__module__.startswith("omegaconf"):  # DictConfig: resolve interpolations, drop ListConfig wrappers
        from omegaconf import OmegaConf

        return OmegaConf.to_container(obj, resolve=True)  # type: ignore[return-value]
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"{what} must be a dict, a dataclass or an OmegaConf DictConfig, got {type(obj).__name__}.")


def json_safe(value: float) -> float | None:
    """``value``, or ``None`` where it is NaN or infinite (strict JSON has no such numbers)."""
    return value if math.isfinite(value) else None


#: ``track_with`` name -> tracker class.
TRACKERS: Registry[type[Tracker]] = Registry("tracker", "register_tracker", base=Tracker)
TrackerT = TypeVar("TrackerT", bound=type[Tracker])


def register_tracker(name: str) -> Callable[[TrackerT], TrackerT]:
    """Class decorator: register a :class:`Tracker` subclass in :data:`TRACKERS` under ``name`` (the ``track_with``
    value).

    Raises:
        ValueError: ``name`` is already registered.
        TypeError: the decorated object is not a ``Tracker`` subclass.
    """

    def decorator(cls: TrackerT) -> TrackerT:
        TRACKERS.register(name)(cls)
        return cls

    return decorator


def list_trackers() -> list[str]:
    """Names of all registered trackers, sorted."""
    return TRACKERS.names()


def get_tracker_class(track_with: str) -> type[Tracker]:
    """The tracker class registered as ``track_with``; ``"package.module:name"`` imports ``package.module`` first
    (a user module that registers its tracker with :func:`register_tracker`).

    Raises:
        UnknownNameError: no tracker has that name (a ``ValueError``); the message lists the registered names.
        ImportError: the module of a ``"package.module:name"`` does not import.
    """
    return TRACKERS.get(track_with)


def build_options(cls: type[Tracker], track_with: str, tracker_kwargs: Mapping[str, Any]) -> TrackerOptions:
    """Build ``cls.options_cls`` from ``tracker_kwargs``.

    Raises:
        ValueError: a key is not a field of the options dataclass; the message lists the accepted keys.
    """
    fields = {f.name for f in dataclasses.fields(cls.options_cls)}
    unknown = sorted(set(tracker_kwargs) - fields)
    if unknown:
        raise ValueError(
            f"tracker_kwargs {unknown} are not accepted by tracker {track_with!r}; accepted keys: {sorted(fields)}. "
            "Remove them or choose the tracker they belong to."
        )
    return cls.options_cls(**dict(tracker_kwargs))


def make_tracker(
    track_with: str,
    *,
    exp_name: str,
    log_dir: str,
    config: Any = None,
    tracker_kwargs: Mapping[str, Any] | None = None,
    run_id: str | None = None,
) -> Tracker:
    """Create the tracker named ``track_with`` (``stdout``, ``tensorboard`` or ``wandb``).

    Args:
        track_with: registered tracker name.
        exp_name: experiment name (the W&B run name unless ``tracker_kwargs["name"]`` is set).
        log_dir: where ``metrics.jsonl`` (and TensorBoard / W&B files unless overridden) go.
        config: the run's config (dict, dataclass or OmegaConf DictConfig); recorded by TensorBoard (as text)
            and W&B.
        tracker_kwargs: backend options (dict or DictConfig), checked against the backend's options dataclass.
        run_id: the run id saved in a checkpoint, to continue that run; ``None`` starts a new run.

    Raises:
        ValueError: unknown ``track_with`` or unknown ``tracker_kwargs`` keys.
        ImportError: the module of a ``"package.module:name"`` does not import.
        TypeError: ``config`` or ``tracker_kwargs`` is not a mapping (or dataclass / DictConfig).
    """
    cls = get_tracker_class(track_with)
    options = build_options(cls, track_with, as_plain_dict(tracker_kwargs, "tracker_kwargs"))
    return cls(exp_name=exp_name, log_dir=log_dir, config=as_plain_dict(config), options=options, run_id=run_id)
