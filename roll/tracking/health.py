"""Run health: is the run learning? Each step's metrics are read against healthy ranges.

A rule (:data:`HEALTH_RULES`, one entry each) reads one metric (the first of its ``metrics`` a step logs: the agentic
and the RLVR names), compares it with its bound (a field of :class:`~roll.config.health.RunHealthConfig`, null =
off) and fires after ``steps`` readings in a row out of range. Then :class:`RunHealth` prints one line with the
likely cause and the action, once; and one line when the metric is back in range. Every step it returns
``health/<rule>`` (1 while the rule fires, for the rules that had a reading) and ``health/alerts`` (the rules firing),
and appends each event to ``<logging_dir>/health.jsonl`` (:data:`HEALTH_FILE`, one JSON object per line:
``{"step", "rule", "event": "fired" | "recovered", "metric", "value", "line"}``) for the dashboard and ``roll
view``. A rule is a function ``(value, bound, seen) -> str | None``: the out-of-range reading in words, or None
when the value is healthy; ``seen`` is what the rule has read before (:class:`Seen`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Protocol

from roll.config.health import RunHealthConfig
from roll.registry import Registry
from roll.tracking.rewind import truncate_jsonl

HEALTH_FILE = "health.jsonl"


@dataclasses.dataclass
class Seen:
    """What a rule read of its metric before and at this step: the first value, the best (highest) value and its
    step, the readings since the best (0 at a new best), and the last value and its step."""

    first: float | None = None
    best: float | None = None
    best_step: int = 0
    since_best: int = 0
    last: float | None = None
    last_step: int = 0

    def add(self, value: float, step: int) -> None:
        """Fold in this step's reading (before the rule reads ``seen``)."""
        if self.first is None:
            self.first = value
        self.last, self.last_step = value, step
        if self.best is None or value > self.best:
            self.best, self.best_step, self.since_best = value, step, 0
        else:
            self.since_best += 1


class RuleFn(Protocol):
    """``(value, bound, seen) -> str | None``: the out-of-range reading in words (``"0.12 > 0.05"``), or None."""

    def __call__(self, value: float, bound: float, seen: Seen) -> str | None: ...


#: Capabilities: ``metrics`` (keys read, the first present wins), ``bound`` (the RunHealthConfig field), ``steps``
#: (readings in a row out of range before the rule fires), ``cause`` and ``action`` (the line's text).
HEALTH_RULES: Registry[RuleFn] = Registry(
    "run-health rule", "register_health_rule", {"metrics": (), "bound": "", "steps": 3, "cause": "", "action": ""}
)
register_health_rule = HEALTH_RULES.register


def _above(value: float, bound: float) -> str | None:
    return f"{value:.3g} > {bound:g}" if value > bound else None


@register_health_rule(
    "approx_kl",
    metrics=("actor/approx_kl",),
    bound="approx_kl_max",
    cause="the policy moves too far in one update",
    action="lower actor_train.training_args.learning_rate or ppo_epochs",
)
def approx_kl(value: float, bound: float, seen: Seen) -> str | None:
    """Healthy: ``actor/approx_kl`` (k3 estimate of KL(old || new) over one step's update) <= ``approx_kl_max``.

    Default 0.05: PPO's usual target KL per update is 0.01-0.05 (Spinning Up's PPO stops an update at 1.5 x its
    ``target_kl`` 0.01); on roll's embedded default one step at 0.1 collapsed the policy (docs/verified.md, Adam
    beta2 0.999), where healthy steps stay at 1e-4-1e-2 (0.0001-0.011 over 15 RL steps, docs/tracking.md)."""
    return _above(value, bound)


@register_health_rule(
    "ref_kl",
    metrics=("actor/ref_kl",),
    bound="ref_kl_max",
    cause="the policy has drifted far from the reference model",
    action="raise kl_loss_coef (use_kl_loss) or init_kl_coef (add_token_level_kl), or lower the learning rate",
)
def ref_kl(value: float, bound: float, seen: Seen) -> str | None:
    """Healthy: ``actor/ref_kl`` (mean k1 KL to the reference per response token) <= ``ref_kl_max``.

    Default 0.5 nats per token (roll's choice): the policy then gives its sampled tokens e^0.5 = 1.6 times the
    reference's probability on average, far past the drift a KL term (verl's and ROLL's default
    ``kl_loss_coef`` 0.001) is there to allow."""
    return _above(value, bound)


@register_health_rule(
    "grad_norm",
    metrics=("actor/grad_norm",),
    bound="grad_norm_max",
    cause="loss spikes: a few samples or tokens dominate the gradient",
    action="lower the learning rate, and look for outlier advantages (advantage_clip, reward_clip)",
)
def grad_norm(value: float, bound: float, seen: Seen) -> str | None:
    """Healthy: ``actor/grad_norm`` (the global norm before clipping) <= ``grad_norm_max``.

    Default 10: 10 x the clip norm of verl's and roll's defaults (``grad_clip`` / ``max_grad_norm`` 1.0); healthy
    pre-clip norms were 0.4-1.8 over 15 RL steps of the embedded default (docs/tracking.md, "Run health") and
    0.2-0.9 on the GPU configs (docs/verified.md). A non-finite norm is not read here: ``max_skipped_updates``
    handles it."""
    return _above(value, bound)


@register_health_rule(
    "clip_frac",
    metrics=("actor/clip_frac",),
    bound="clip_frac_max",
    cause="updates leave PPO's trust region: the ratio to the sampling policy is clipped on many tokens",
    action="lower the learning rate or ppo_epochs, or use larger mini-batches",
)
def clip_frac(value: float, bound: float, seen: Seen) -> str | None:
    """Healthy: ``actor/clip_frac`` (share of response tokens where the clipped branch was taken) <= ``clip_frac_max``.

    Default 0.3 (roll's choice): with the usual clip range 0.2 (roll's ``pg_clip``; verl's ``clip_ratio``, whose
    parameter guide gives [0.1, 0.3] as its typical range) an update that clips most tokens has left the trust
    region; the embedded default (4 optimizer steps per rollout) clipped 0.0005-0.025 of its tokens over 15 RL
    steps (docs/tracking.md, "Run health")."""
    return _above(value, bound)


@register_health_rule(
    "entropy_collapse",
    metrics=("actor/entropy",),
    bound="entropy_min_ratio",
    cause="the policy collapsed to near-certain tokens: it stops exploring, and groups solved alike give no signal",
    action="raise entropy_loss_coef or the sampling temperature, or lower the learning rate",
)
def entropy_collapse(value: float, bound: float, seen: Seen) -> str | None:
    """Healthy: ``actor/entropy`` >= ``entropy_min_ratio`` x its first value in the run.

    Default 0.1 (entropy depends on the task, so the bound is a fraction of the start): a learning run's entropy
    falls slowly (0.32 to 0.18 over the embedded default's 80 steps, docs/verified.md); in the entropy-collapse
    study of verl's docs/algo/entropy.md (Cui et al. 2025) GRPO's entropy ends on a plateau more than 10 times
    below the level KL-Cov keeps."""
    first = seen.first if seen.first is not None else value
    return f"{value:.3g} < {bound:g} x its first value {first:.3g}" if value < bound * first else None


@register_health_rule(
    "zero_signal",
    metrics=("rollout/zero_signal_frac",),
    bound="zero_signal_max",
    cause="most groups scored alike (all solved or all failed), so their advantages are 0 and they teach nothing",
    action="give tasks that fit the policy (easier or harder), more samples per group (group_size / "
    "num_return_sequences_in_group), or dynamic sampling (RLVR)",
)
def zero_signal(value: float, bound: float, seen: Seen) -> str | None:
    """Healthy: ``rollout/zero_signal_frac`` (groups whose advantages are all zero) <= ``zero_signal_max``.

    Default 0.5 (roll's choice): past half, the batch trains on a few groups; at 1 nothing trains and
    ``zero_signal_patience`` stops the run. DAPO's dynamic sampling (verl's ``algorithm.filter_groups``) exists
    for this case."""
    return _above(value, bound)


@register_health_rule(
    "val_stalled",
    metrics=("val/success_rate", "val/accuracy"),
    bound="val_stall_evals",
    steps=1,
    cause="validation has stopped improving",
    action="see the other health lines and roll view; lower the learning rate, or stop the run: more of the same "
    "steps will not raise it",
)
def val_stalled(value: float, bound: float, seen: Seen) -> str | None:
    """Healthy: validation success reaches a new best within ``val_stall_evals`` evaluations (the step-0
    evaluation, the warm start's level, counts).

    Default 3 evaluations (roll's choice): with the embedded default's ``eval_steps`` 40 that is 120 steps without a
    new best; one evaluation of 512 rooms has 2-3 points of noise, so a real gain beats the best within a few."""
    if seen.since_best < bound:
        return None
    return f"{value:.3g}, no new best ({seen.best:.3g} at step {seen.best_step}) in {seen.since_best} evaluations"


@register_health_rule(
    "logprob_mismatch",
    metrics=("rollout/logprob_mismatch",),
    bound="logprob_mismatch_max",
    cause="the engine samples from another policy than the trainer computes (sampling settings the trainer does not "
    "apply, such as top_k; lower precision; or a weight sync that did not arrive)",
    action="match the engine's sampling and dtype to the trainer's, check sync/* and time/sync, or turn on "
    "train_infer_correction",
)
def logprob_mismatch(value: float, bound: float, seen: Seen) -> str | None:
    """Healthy: ``rollout/logprob_mismatch`` (mean |engine - trainer| log-prob of the sampled tokens) <=
    ``logprob_mismatch_max``.

    Default 0.02: healthy bf16 runs measured 0.0005-0.01 (SGLang, Megatron; docs/verified.md), the GPU checks
    bound it at 0.01-0.02 (``scripts/verify_gpu_*.sh``), and a sync that did not arrive gives about 1."""
    return _above(value, bound)


@register_health_rule(
    "truncation",
    metrics=("rollout/truncated_by_length", "rollout/truncated_rate"),
    bound="truncated_max",
    cause="episodes or responses hit the length limit and are cut before their end",
    action="raise sequence_length (agentic), response_length or max_new_tokens (RLVR), or penalize length",
)
def truncation(value: float, bound: float, seen: Seen) -> str | None:
    """Healthy: the share cut by the length limit (``rollout/truncated_by_length``, RLVR ``rollout/truncated_rate``)
    <= ``truncated_max``.

    Default 0.2 (roll's choice): verl logs the same share (``response_length/clip_ratio``); a cut response gets no
    outcome reward, so past a fifth of the batch the reward measures the limit more than the policy."""
    return _above(value, bound)


@dataclasses.dataclass
class RuleState:
    """A rule's state in a run: what it read, the readings in a row out of range, whether it fires."""

    seen: Seen = dataclasses.field(default_factory=Seen)
    out: int = 0
    firing: bool = False


class RunHealth:
    """Reads each step's metrics against :data:`HEALTH_RULES` (see the module docstring): ``health(step, metrics)``
    returns ``health/<rule>`` and ``health/alerts``; its state goes into checkpoints (:meth:`state_dict`).

    Args:
        cfg: the ``run_health`` block.
        log_dir: where ``health.jsonl`` goes (None: no file).
        stream: where the lines go (default ``sys.stderr`` at each line).
    """

    def __init__(self, cfg: RunHealthConfig, log_dir: str | Path | None = None, stream: IO[str] | None = None):
        self.cfg, self.stream = cfg, stream
        self.path = Path(log_dir) / HEALTH_FILE if log_dir is not None else None
        self.states = {name: RuleState() for name in HEALTH_RULES.names()}
        self._events: list[dict[str, Any]] = []

    def __call__(self, step: int, metrics: Mapping[str, float]) -> dict[str, float]:
        """Read ``step``'s ``metrics``; returns ``health/<rule>`` and ``health/alerts`` (empty when disabled)."""
        if not self.cfg.enabled:
            return {}
        out: dict[str, float] = {}
        for name, state in self.states.items():
            caps = HEALTH_RULES.capabilities(name)
            bound = getattr(self.cfg, caps["bound"])
            key = next((k for k in caps["metrics"] if k in metrics and math.isfinite(float(metrics[k]))), None)
            if bound is None or key is None:
                continue
            value = float(metrics[key])
            state.seen.add(value, step)
            problem = HEALTH_RULES.get(name)(value, bound, state.seen)
            state.out = state.out + 1 if problem else 0
            firing = state.out >= caps["steps"]
            if firing and not state.firing:
                length = f" for {state.out} steps" if caps["steps"] > 1 else ""
                self._event(
                    step,
                    name,
                    "fired",
                    key,
                    value,
                    f"{key} {problem}{length}: {caps['cause']}; {caps['action']} (run_health.{caps['bound']})",
                )
            elif state.firing and not firing:
                self._event(step, name, "recovered", key, value, f"{key} back in range ({value:.3g}): {name} recovered")
            state.firing = firing
            out[f"health/{name}"] = float(firing)
        out["health/alerts"] = float(sum(s.firing for s in self.states.values()))
        return out

    def _event(self, step: int, rule: str, event: str, key: str, value: float, text: str) -> None:
        line = f"[roll] health: step {step}: {text}"
        print(line, file=self.stream or sys.stderr, flush=True)
        record = {"step": step, "rule": rule, "event": event, "metric": key, "value": value, "line": line}
        self._events.append(record)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    def firing(self) -> list[str]:
        """The rules firing now."""
        return [name for name, state in self.states.items() if state.firing]

    def events(self) -> list[dict[str, Any]]:
        """The run's events so far (those of ``health.jsonl``, which a resumed run continues; without a file, this
        process's)."""
        if self.path is None:
            return list(self._events)
        return read_events(self.path)

    def summary(self) -> str:
        """One line for the end of a run: the rules that fired and at which steps (and which still fire), and
        validation success at the start, its best and at the end."""
        if not self.cfg.enabled:
            return "[roll] health: run_health.enabled=false, not checked"
        fired: dict[str, list[int]] = {}
        for event in self.events():
            if event["event"] == "fired":
                fired.setdefault(event["rule"], []).append(int(event["step"]))
        parts = [
            f"{rule} at step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))}"
            f"{' (still firing)' if self.states[rule].firing else ''}"
            for rule, steps in fired.items()
        ]
        alerts = f"{len(parts)} rule(s) fired: {'; '.join(parts)}" if parts else "no rule left its healthy range"
        val = self.states["val_stalled"].seen
        if val.first is None or val.best is None or val.last is None:
            return f"[roll] health: {alerts}"
        return (
            f"[roll] health: {alerts}; validation success {val.first:.3g} at the start, best {val.best:.3g} at step "
            f"{val.best_step}, {val.last:.3g} at step {val.last_step} (the end)"
        )

    def rewind(self, step: int) -> None:
        """Drop the events of steps after ``step`` from ``health.jsonl`` (a new run: ``step`` 0, all of them; a
        resume replays the steps after its checkpoint)."""
        if self.path is not None:
            truncate_jsonl(self.path, step)

    def state_dict(self) -> dict[str, Any]:
        """Picklable state for checkpoints."""
        return {name: dataclasses.asdict(state) for name, state in self.states.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (rules it does not name start afresh)."""
        for name, saved in state.items():
            if name in self.states:
                self.states[name] = RuleState(Seen(**saved["seen"]), saved["out"], saved["firing"])


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """The events of a ``health.jsonl`` in file order ([] when there is none; a torn last line is skipped)."""
    path = Path(path)
    if not path.is_file():
        return []
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events
