"""LoRA keys of a worker block (``model_args.lora_target``, ``lora_rank``, ``lora_alpha``, ``lora_dropout``,
``lora_reference``) read once into :class:`LoraSettings`, and the rules across blocks (:func:`check_lora`).

LoRA is on when ``actor_train.model_args.lora_target`` is set, as in ROLL. ``actor_infer`` may carry the same keys
(ROLL's engines serve the adapter from them); roll's engines serve actor_train's adapter, so there they must agree
with actor_train's. A ``critic`` stays full-weight and the reference is the base model: LoRA keys on either are an
error. What needs the registry or the model's files (a strategy that builds adapters; ``all-linear`` on one block
against module names on the other) is checked by the preflight (:func:`roll.launch.preflight.check_lora`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from roll.config.errors import ConfigError

#: peft's name for every linear layer but the output layer.
ALL_LINEAR = "all-linear"
#: Characters that make a ``lora_target`` string a regex over module paths (ROLL's rule) rather than a name list.
REGEX_CHARS = ("*", "$", "|", "(")
#: ROLL's defaults: rank 8, alpha twice the rank.
DEFAULT_RANK = 8
LORA_KEYS = ("lora_target", "lora_rank", "lora_alpha", "lora_dropout")


@dataclass(frozen=True)
class LoraSettings:
    """The adapters of one model: rank ``r``, scale ``alpha / r``, input dropout, and the target modules
    (:data:`ALL_LINEAR`, a regex, or a sorted tuple of module names)."""

    rank: int
    alpha: float
    dropout: float
    target: str | tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...] | None:
        """The target module names, when the target is a list of names (not all-linear or a regex)."""
        return self.target if isinstance(self.target, tuple) else None

    @property
    def target_text(self) -> str:
        """The target as a config writes it (names as a comma string)."""
        return ",".join(self.target) if isinstance(self.target, tuple) else self.target


def parse_target(value: Any, key: str) -> str | tuple[str, ...]:
    """``lora_target`` in its canonical form: :data:`ALL_LINEAR` (also ROLL's ``all``), a regex string kept whole,
    or the sorted, deduplicated module names of a comma string or a list."""
    if isinstance(value, str):
        text = value.strip()
        if text in (ALL_LINEAR, "all"):
            return ALL_LINEAR
        if any(c in text for c in REGEX_CHARS):
            return text
        value = text.split(",")
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        names = tuple(sorted({v.strip() for v in value if v.strip()}))
        if names and ALL_LINEAR not in names:
            return names
    raise ConfigError(key, value, f"expected {ALL_LINEAR}, module names (a comma string or a list) or a regex")


def lora_settings(model_args: Any, key: str = "actor_train.model_args") -> LoraSettings | None:
    """The LoRA settings of a ``model_args`` block (None when ``lora_target`` is unset: full fine-tuning). Rank,
    alpha or dropout without a target is an error: they would be ignored."""
    if model_args.lora_target in (None, "", []):
        for name in ("lora_rank", "lora_alpha"):
            if getattr(model_args, name) is not None:
                raise ConfigError(
                    f"{key}.{name}",
                    getattr(model_args, name),
                    f"LoRA is off without {key}.lora_target; set it (e.g. {ALL_LINEAR}) or remove {name}",
                )
        if model_args.lora_dropout:
            raise ConfigError(f"{key}.lora_dropout", model_args.lora_dropout, f"LoRA is off without {key}.lora_target")
        return None
    rank = DEFAULT_RANK if model_args.lora_rank is None else int(model_args.lora_rank)
    alpha = 2.0 * rank if model_args.lora_alpha is None else float(model_args.lora_alpha)
    target = parse_target(model_args.lora_target, f"{key}.lora_target")
    return LoraSettings(rank=rank, alpha=alpha, dropout=float(model_args.lora_dropout), target=target)


def actor_lora(cfg: Any) -> LoraSettings | None:
    """actor_train's LoRA settings (None: full fine-tuning)."""
    train = getattr(cfg, "actor_train", None)
    return None if train is None else lora_settings(train.model_args)


def reference_from_actor(cfg: Any) -> bool:
    """Whether reference log-probs come from actor_train with its adapters off (LoRA with ``lora_reference:
    adapters_off``) rather than from a ``reference`` worker; such a run starts no reference worker."""
    return actor_lora(cfg) is not None and cfg.actor_train.model_args.lora_reference == "adapters_off"


def wants_reference(cfg: Any) -> bool:
    """Whether the run computes reference log-probs: a KL term is on or a ``reference`` block is configured."""
    return bool(cfg.add_token_level_kl or cfg.use_kl_loss or getattr(cfg, "reference", None) is not None)


def share_engine_lora(cfg: Any) -> None:
    """With LoRA, actor_infer serves actor_train's adapter: its ``model_args`` get actor_train's LoRA keys where it
    sets none (ROLL's configs repeat them there; differing keys are refused by :func:`check_lora`), so that an
    engine that needs them at start (SGLang: ``max_lora_rank``, ``lora_target_modules``), the memory planner and
    the doctor see them. Run once when the config loads (:func:`roll.config.validation.normalize`)."""
    train, infer = getattr(cfg, "actor_train", None), getattr(cfg, "actor_infer", None)
    if train is None or infer is None or train.model_args.lora_target in (None, "", []):
        return
    if infer.model_args.lora_target in (None, "", []):
        for key in LORA_KEYS:
            setattr(infer.model_args, key, getattr(train.model_args, key))


def check_lora(cfg: Any) -> None:
    """The LoRA rules across blocks (the module docstring); each a one-line :class:`ConfigError`."""
    train = actor_lora(cfg)
    for role in ("critic", "reference"):
        block = getattr(cfg, role, None)
        if block is None:
            continue
        margs = block.model_args
        for name in LORA_KEYS:
            value = getattr(margs, name)
            if value not in (None, "", [], 0, 0.0):
                why = (
                    "a critic stays full-weight (its value head and body train in full)"
                    if role == "critic"
                    else "the reference is the base model: with LoRA on actor_train it is the actor with its "
                    "adapters off (actor_train.model_args.lora_reference)"
                )
                raise ConfigError(f"{role}.model_args.{name}", value, f"LoRA applies to actor_train only; {why}")
    for role in ("actor_infer", "critic", "reference"):
        block = getattr(cfg, role, None)
        if block is not None and block.model_args.lora_reference != "adapters_off":
            raise ConfigError(
                f"{role}.model_args.lora_reference",
                block.model_args.lora_reference,
                "read on actor_train only; set actor_train.model_args.lora_reference",
            )
    infer = getattr(cfg, "actor_infer", None)
    engine = lora_settings(infer.model_args, "actor_infer.model_args") if infer is not None else None
    if engine is not None:
        check_agreement(train, engine)


def check_agreement(train: LoraSettings | None, engine: LoraSettings) -> None:
    """actor_infer's LoRA keys equal actor_train's (the engine serves actor_train's adapter). ``all-linear`` on one
    side and module names on the other are compared by the preflight, on the model."""
    if train is None:
        raise ConfigError(
            "actor_infer.model_args.lora_target",
            engine.target_text,
            "the engine serves actor_train's adapter, and actor_train has no LoRA; set the LoRA keys on "
            "actor_train.model_args (or remove them here)",
        )
    for name, field in (("lora_rank", "rank"), ("lora_alpha", "alpha"), ("lora_dropout", "dropout")):
        if getattr(engine, field) != getattr(train, field):
            raise ConfigError(
                f"actor_infer.model_args.{name}",
                getattr(engine, field),
                f"differs from actor_train.model_args.{name} ({getattr(train, field)}); the engine serves "
                f"actor_train's adapter: make them equal or remove it here",
            )
    mixed = ALL_LINEAR in (train.target, engine.target) and (train.names or engine.names)
    if train.target != engine.target and not mixed:
        raise ConfigError(
            "actor_infer.model_args.lora_target",
            engine.target_text,
            f"differs from actor_train.model_args.lora_target ({train.target_text}); the engine serves "
            f"actor_train's adapter: make them equal or remove it here",
        )
