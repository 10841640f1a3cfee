"""The memory planner: each GPU's estimated peak for a config, per role and per phase, shown by ``roll doctor`` and
checked by the launch's preflight before any worker starts (docs/memory.md).

Phases follow :mod:`roll.distributed.colocation`: the rollout phase runs ``actor_infer``, the training phase
``actor_train``, ``reference`` and ``critic``. On a GPU shared by roles of both phases, an idle role offloads with
``colocated_offload`` ``always`` or ``auto`` (``auto`` stays resident only after measuring that both fit, so the
plan counts it as ``always``) and holds everything with ``never``. Each GPU's column adds, per role, its resident
and working terms (its phase runs), its offloaded terms (idle, offloading) or its resident terms (idle, staying),
then the overhead: :data:`~roll.launch.memory.CUDA_CONTEXT_GIB` per process and
:data:`~roll.launch.memory.FRAGMENTATION` of the torch roles' total.

A config whose peak exceeds the GPU is refused (``memory_check: refuse``) with one line naming the largest
consumer and the changes that would make it fit, each estimated by planning the changed config (:func:`what_ifs`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from roll.config.errors import ConfigError
from roll.config.validation import ROLES, parse_device_mapping
from roll.distributed.colocation import ROLLOUT_ROLES
from roll.launch import memory_models  # noqa: F401  (registers the built-in memory models)
from roll.launch.memory import (
    CUDA_CONTEXT_GIB,
    FRAGMENTATION,
    GIB,
    MEMORY_MODELS,
    ModelShape,
    RoleInputs,
    RoleMemory,
    Term,
    lora_of,
    reference_from_adapters,
)

PHASES = ("rollout", "training")
#: Rows of the table, top to bottom: actor_train's terms, then the other roles, then the overhead.
ROWS = ("weights", "grads", "optimizer", "activations", "logits", "reference", "critic", "engine", "overhead")
#: LoRA rank the refusal proposes.
SUGGESTED_LORA_RANK = 32
#: actor_train's strategy options, the prefix of the keys the refusal proposes for its backend.
TRAIN_OPTIONS = "actor_train.strategy_args.strategy_config"


class MemoryPlanError(ConfigError):
    """A config whose estimated peak exceeds its GPU (``memory_check: refuse``): one line, exit code 2."""

    def __init__(self, line: str):
        super().__init__("memory_check", "refuse", line)

    def __str__(self) -> str:
        return f"memory: {self.expected}"


@dataclass(frozen=True)
class Column:
    """The terms on a group of GPUs that hold the same roles, in one phase."""

    gpus: tuple[int, ...]
    phase: str
    terms: tuple[Term, ...]

    @property
    def total(self) -> float:
        return sum(t.gib for t in self.terms)

    def row(self, name: str) -> float | None:
        """GiB of table row ``name`` (None: nothing on these GPUs belongs to it)."""
        terms = [t.gib for t in self.terms if t.row == name]
        return sum(terms) if terms else None

    @property
    def where(self) -> str:
        return gpu_label(self.gpus)


@dataclass(frozen=True)
class MemoryPlan:
    """The estimate of a config: the GPU's memory, a column per GPU group and phase, and each role's model."""

    gpu_gib: float
    columns: tuple[Column, ...]
    roles: dict[str, RoleMemory]
    notes: tuple[str, ...] = ()  # roles not estimated (and why), LoRA targets unknown to the planner

    def peak(self) -> Column:
        return max(self.columns, key=lambda c: c.total)

    @property
    def fits(self) -> bool:
        return not self.columns or self.peak().total <= self.gpu_gib


def phase_of(role: str) -> str:
    """The phase that runs ``role``: rollout for the rollout roles of :mod:`roll.distributed.colocation`."""
    return "rollout" if role in ROLLOUT_ROLES else "training"


def gpu_label(gpus: tuple[int, ...]) -> str:
    """``GPU 0``, ``GPUs 0-3`` or ``GPUs 0,2``."""
    if len(gpus) == 1:
        return f"GPU {gpus[0]}"
    if list(gpus) == list(range(gpus[0], gpus[-1] + 1)):
        return f"GPUs {gpus[0]}-{gpus[-1]}"
    return "GPUs " + ",".join(map(str, gpus))


def gpu_workers(cfg: Any) -> dict[str, Any]:
    """The configured roles that run on GPUs (a non-empty ``device_mapping``)."""
    out = {}
    for role in ROLES:
        worker = getattr(cfg, role, None)
        if worker is not None and parse_device_mapping(worker.device_mapping, f"{role}.device_mapping"):
            out[role] = worker
    return out


def model_shape(path: str | None) -> ModelShape:
    """The shape of the model at ``path``: its local ``config.json``, else the Hugging Face cache's (no download).

    Raises:
        ValueError: no ``config.json`` found, or not a dense decoder.
    """
    from roll.config.megatron import read_hf_config

    hf = read_hf_config(path)
    if hf is None and path:
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(path, "config.json")
            if isinstance(cached, str):
                hf = read_hf_config(cached.rsplit("/", 1)[0])
        except Exception:  # not a hub name: reported below
            hf = None
    if hf is None:
        raise ValueError(f"no config.json for model {path!r} (a local directory or a cached hub model)")
    return ModelShape.from_config(hf, f"{path}/config.json")


def role_memory(cfg: Any, role: str, worker: Any, gpu_gib: float, notes: list[str]) -> RoleMemory | None:
    """The memory model of one role, or None with a note (no memory model for its strategy, no config.json)."""
    name = worker.strategy_args.strategy_name
    if name not in MEMORY_MODELS:
        notes.append(f"{role} not estimated: strategy {name!r} has no memory model (register_memory_model)")
        return None
    try:
        shape = model_shape(worker.model_args.model_name_or_path or cfg.pretrain)
    except ValueError as exc:
        notes.append(f"{role} not estimated: {exc}")
        return None
    mapping = parse_device_mapping(worker.device_mapping, f"{role}.device_mapping")
    inputs = RoleInputs(
        role=role,
        worker=worker,
        shape=shape,
        world=max(1, len(mapping) // max(1, worker.num_gpus_per_worker)),
        sequence_length=int(cfg.sequence_length),
        gpu_gib=gpu_gib,
        lora=lora_of(worker.model_args) if role == "actor_train" else (0, ()),
        max_running_requests=cfg.max_running_requests,
    )
    memory = MEMORY_MODELS.get(name)(inputs)
    notes += [f"{role}: {n}" for n in inputs.notes]
    return memory


def plan_memory(cfg: Any, gpu_gib: float) -> MemoryPlan:
    """Estimate every GPU of ``cfg`` in each phase its roles run, for GPUs of ``gpu_gib`` GiB (see the module
    docstring for how the columns are added up)."""
    workers, notes = gpu_workers(cfg), []
    if "reference" in workers and "actor_train" in workers and reference_from_adapters(cfg):
        notes.append("reference not counted: LoRA computes it with actor_train's adapters off")
        workers.pop("reference")
    roles = {r: m for r, w in workers.items() if (m := role_memory(cfg, r, w, gpu_gib, notes)) is not None}
    on_gpu: dict[int, set[str]] = {}
    for role in roles:
        for gpu in parse_device_mapping(workers[role].device_mapping):
            on_gpu.setdefault(gpu, set()).add(role)
    groups: dict[frozenset[str], list[int]] = {}
    for gpu, roles_here in sorted(on_gpu.items()):
        groups.setdefault(frozenset(roles_here), []).append(gpu)
    offload = cfg.colocated_offload != "never"
    columns = []
    for held, gpus in groups.items():
        for phase in (p for p in PHASES if any(phase_of(r) == p for r in held)):
            columns.append(Column(tuple(gpus), phase, _column_terms(roles, sorted(held), phase, offload)))
    return MemoryPlan(gpu_gib, tuple(columns), roles, tuple(notes))


def _column_terms(roles: dict[str, RoleMemory], held: list[str], phase: str, offload: bool) -> tuple[Term, ...]:
    """The terms on a GPU holding ``held`` roles in ``phase``, with the overhead."""
    terms: list[Term] = []
    torch_gib, processes = 0.0, 0
    for role in held:
        memory = roles[role]
        if phase_of(role) == phase:
            own = memory.resident + memory.working
        else:
            own = memory.offloaded if offload else memory.resident
        terms += [t for t in own if t.gib > 0]
        torch_gib += 0 if memory.pooled else sum(t.gib for t in own)
        processes += memory.processes
    terms.append(Term("all", "overhead", f"CUDA contexts ({processes} processes)", processes * CUDA_CONTEXT_GIB))
    terms.append(Term("all", "overhead", "allocator fragmentation", FRAGMENTATION * torch_gib))
    return tuple(terms)


# ---------------------------------------------------------------------------- the GPU's memory
def detected_gpu_gib() -> float | None:
    """GiB of this machine's GPU 0 (``torch.cuda.get_device_properties``), or None without a visible CUDA GPU."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return None
    return torch.cuda.get_device_properties(0).total_memory / GIB


def gpu_memory(cfg: Any, flag: float | None = None) -> tuple[float | None, str]:
    """``(GiB per GPU, where it came from)``: ``flag`` (``roll doctor --gpu-memory-gib``), else this machine's
    GPU, else the config's ``gpu_memory_gib``; ``(None, "")`` when none is known."""
    if flag:
        return float(flag), "--gpu-memory-gib"
    detected = detected_gpu_gib()
    if detected:
        return detected, "this machine's GPU 0"
    if cfg.gpu_memory_gib:
        return float(cfg.gpu_memory_gib), "gpu_memory_gib"
    return None, ""


# ---------------------------------------------------------------------------- what would make it fit
@dataclass(frozen=True)
class WhatIf:
    """A change the refusal may propose: its label (naming the keys), the new values by dotted key, and its
    family (of a family's candidates, tried in order, the first that fits is shown, else the lowest)."""

    label: str
    changes: dict[str, Any]
    family: str


def changed(cfg: Any, changes: dict[str, Any]) -> Any:
    """A copy of ``cfg`` with ``changes`` (dotted key -> value) applied; ``cfg`` is not modified."""
    new = copy.deepcopy(cfg)
    for dotted, value in changes.items():
        *path, leaf = dotted.split(".")
        node = new
        for part in path:
            node = node[part] if isinstance(node, dict) else getattr(node, part)
        if isinstance(node, dict):
            node[leaf] = value
        else:
            setattr(node, leaf, value)
    return new


def what_ifs(cfg: Any, plan: MemoryPlan) -> list[WhatIf]:
    """The changes worth estimating for ``cfg``: LoRA, checkpointing, offload and sharding over more GPUs for
    actor_train, a smaller training or log-prob micro-batch, a smaller SGLang pool, offloading between phases."""
    out: list[WhatIf] = []
    if "actor_train" in plan.roles:
        out += _trainer_what_ifs(cfg.actor_train, plan.roles["actor_train"].strategy)
        out += _token_what_ifs(cfg)
    out += _scoring_token_what_ifs(cfg, [r for r in ("actor_train", "reference", "critic") if r in plan.roles])
    infer = plan.roles.get("actor_infer")
    if infer is not None and infer.strategy == "sglang":
        key = "actor_infer.strategy_args.strategy_config.mem_fraction_static"
        from roll.strategies.registry import strategy_options

        fraction = strategy_options(cfg.actor_infer, "actor_infer.strategy_args.strategy_config").mem_fraction_static
        floor = sum(t.gib for t in infer.resident if t.what == "weights") / plan.gpu_gib + 0.05
        for step in range(1, 10):
            lower = round(fraction - 0.05 * step, 2)
            if lower >= floor:
                out.append(WhatIf(f"a smaller engine pool ({key}={lower:g})", {key: lower}, "pool"))
    if cfg.colocated_offload == "never":
        out.append(WhatIf("offloading between phases (colocated_offload=always)", {"colocated_offload": "always"}, "o"))
    return out


def _trainer_what_ifs(worker: Any, strategy: str) -> list[WhatIf]:
    """actor_train's changes: LoRA, activation checkpointing, then its backend's CPU offload and sharding."""
    from roll.strategies.registry import strategy_options

    opts, out = strategy_options(worker, TRAIN_OPTIONS), []
    if not lora_of(worker.model_args)[0]:
        key = "actor_train.model_args"
        changes = {f"{key}.lora_target": "all-linear", f"{key}.lora_rank": SUGGESTED_LORA_RANK}
        label = f"LoRA ({key}.lora_target=all-linear {key}.lora_rank={SUGGESTED_LORA_RANK})"
        out.append(WhatIf(label, changes, "lora"))
    if strategy in ("deepspeed_train", "fsdp2_train") and worker.model_args.disable_gradient_checkpointing:
        key = "actor_train.model_args.disable_gradient_checkpointing"
        out.append(WhatIf(f"gradient checkpointing ({key}=false)", {key: False}, "ckpt"))
    if strategy == "megatron_train" and opts.recompute_granularity != "full":
        key = f"{TRAIN_OPTIONS}.recompute_granularity"
        out.append(WhatIf(f"full recompute ({key}=full)", {key: "full"}, "ckpt"))
    mapping = parse_device_mapping(worker.device_mapping)
    if strategy == "deepspeed_train":
        out += _zero_what_ifs(int(opts.stage), len(mapping))
        out += _more_gpus("ZeRO-3", {f"{TRAIN_OPTIONS}.zero_stage": 3}, mapping)
    elif strategy == "fsdp2_train":
        key = f"{TRAIN_OPTIONS}.offload_policy"
        out.append(WhatIf(f"CPU offload ({key}=true)", {key: True}, "offload"))
        out += _more_gpus("FSDP2", {}, mapping)
    return out


def _zero_what_ifs(stage: int, world: int) -> list[WhatIf]:
    """DeepSpeed: optimizer offload, parameter and optimizer offload, ZeRO-3 over the role's own ranks."""
    s = TRAIN_OPTIONS
    out = [
        WhatIf(
            f"optimizer offload ({s}: zero_stage={max(stage, 2)}, offload_optimizer=cpu)",
            {f"{s}.zero_stage": max(stage, 2), f"{s}.offload_optimizer": "cpu"},
            "offload",
        ),
        WhatIf(
            f"parameter and optimizer offload ({s}: zero_stage=3, offload_param=cpu, offload_optimizer=cpu)",
            {f"{s}.zero_stage": 3, f"{s}.offload_param": "cpu", f"{s}.offload_optimizer": "cpu"},
            "offload",
        ),
    ]
    if stage < 3 and world > 1:
        out.append(WhatIf(f"ZeRO-3 ({s}.zero_stage=3)", {f"{s}.zero_stage": 3}, "shard"))
    return out


def _more_gpus(what: str, changes: dict[str, Any], mapping: list[int]) -> list[WhatIf]:
    """actor_train sharded over 2, 4 or 8 GPUs from its first one (the other roles stay where they are)."""
    first, out = min(mapping), []
    for n in (2, 4, 8):
        if n > len(mapping):
            extra = "".join(f", {k.rsplit('.', 1)[1]}={v}" for k, v in changes.items())
            label = f"{what} over {n} GPUs (actor_train.device_mapping=list(range({first},{first + n})){extra})"
            out.append(WhatIf(label, {"actor_train.device_mapping": list(range(first, first + n)), **changes}, "gpus"))
    return out


def _token_what_ifs(cfg: Any) -> list[WhatIf]:
    """actor_train's micro-batch halved, up to four times (the samples per optimizer step kept)."""
    w, out = cfg.actor_train, []
    if w.use_dynamic_batching_in_train and w.max_tokens_per_microbatch_in_train > 0:
        key = "actor_train.max_tokens_per_microbatch_in_train"
        for k in range(1, 5):
            budget = w.max_tokens_per_microbatch_in_train >> k
            if budget >= 256:
                out.append(WhatIf(f"a smaller micro-batch ({key}={budget})", {key: budget}, "tokens"))
        return out
    ta, key = w.training_args, "actor_train.training_args"
    for k in range(1, 5):
        size = ta.per_device_train_batch_size >> k
        if size >= 1:
            accumulate = ta.gradient_accumulation_steps * ta.per_device_train_batch_size // size
            label = (
                f"a smaller micro-batch ({key}: per_device_train_batch_size={size}, "
                f"gradient_accumulation_steps={accumulate})"
            )
            keys = {f"{key}.per_device_train_batch_size": size, f"{key}.gradient_accumulation_steps": accumulate}
            out.append(WhatIf(label, keys, "tokens"))
    return out


def _scoring_token_what_ifs(cfg: Any, roles: list[str]) -> list[WhatIf]:
    """The log-prob (and value) micro-batch of the training-phase roles halved, up to four times, all together:
    ``max_tokens_per_microbatch_in_infer`` with dynamic batching, else ``infer_batch_size``."""
    out = []
    for k in range(1, 5):
        changes = {}
        for role in roles:
            w = getattr(cfg, role)
            if w.use_dynamic_batching_in_infer and w.max_tokens_per_microbatch_in_infer > 0:
                if w.max_tokens_per_microbatch_in_infer >> k >= 256:
                    changes[f"{role}.max_tokens_per_microbatch_in_infer"] = w.max_tokens_per_microbatch_in_infer >> k
            elif w.infer_batch_size >> k >= 1:
                changes[f"{role}.infer_batch_size"] = w.infer_batch_size >> k
        if changes:
            keys = ", ".join(f"{key}={value}" for key, value in changes.items())
            out.append(WhatIf(f"a smaller log-prob micro-batch ({keys})", changes, "infer tokens"))
    return out


def suggestions(cfg: Any, plan: MemoryPlan) -> list[tuple[str, float]]:
    """``(label, estimated peak GiB)`` of each change that lowers the peak: per family the first candidate that
    fits, else the lowest; sorted by peak."""
    peak, best, done = plan.peak().total, {}, set()
    for what_if in what_ifs(cfg, plan):
        if what_if.family in done:
            continue
        try:
            new = plan_memory(changed(cfg, what_if.changes), plan.gpu_gib)
        except (ConfigError, ValueError):  # a combination the options refuse: not proposed
            continue
        gib = new.peak().total if new.columns else peak
        if gib >= peak - 0.05:
            continue
        if new.fits:
            done.add(what_if.family)
            best[what_if.family] = (what_if.label, gib)
        elif what_if.family not in best or gib < best[what_if.family][1]:
            best[what_if.family] = (what_if.label, gib)
    return sorted(best.values(), key=lambda s: s[1])


# ---------------------------------------------------------------------------- reports
def refusal(cfg: Any, plan: MemoryPlan) -> str:
    """The one line of a config that does not fit: the peak, where, its largest term, and the changes that lower
    it with their estimated peaks."""
    peak = plan.peak()
    top = max(peak.terms, key=lambda t: t.gib)
    owner = "" if top.role == "all" else f"{top.role} "
    fixes = ", ".join(f"{label} -> {gib:.1f} GiB" for label, gib in suggestions(cfg, plan))
    return (
        f"{peak.total:.1f} GiB needed on {peak.where} in the {peak.phase} phase ({owner}{top.what} {top.gib:.1f} "
        f"GiB the largest) > {plan.gpu_gib:.1f} GiB: {fixes or 'no change the planner knows of fits'}; or "
        f"memory_check: warn to launch anyway (docs/memory.md)"
    )


def summary_line(plan: MemoryPlan) -> str:
    """The estimate in one line: the peak, where, by role, and the other columns' totals."""
    peak = plan.peak()
    by_role: dict[str, float] = {}
    for t in peak.terms:
        name = "overhead" if t.role == "all" else t.role
        by_role[name] = by_role.get(name, 0.0) + t.gib
    parts = ", ".join(f"{role} {gib:.1f}" for role, gib in by_role.items())
    others = "; ".join(f"{c.where} {c.phase} {c.total:.1f} GiB" for c in plan.columns if c is not peak)
    return (
        f"peak {peak.total:.1f} of {plan.gpu_gib:.1f} GiB on {peak.where} in the {peak.phase} phase ({parts})"
        + (f"; {others}" if others else "")
        + "".join(f"; {n}" for n in plan.notes)
    )


def check_memory(cfg: Any) -> list[str]:
    """The preflight's check (GPU runs, ``memory_check`` not ``off``): print the estimate in one line; a peak over
    the GPU raises :class:`MemoryPlanError` (``refuse``) or is returned as a warning (``warn``)."""
    if cfg.memory_check == "off" or not gpu_workers(cfg):
        return []
    gpu_gib, _ = gpu_memory(cfg)
    if gpu_gib is None:
        return ["memory_check: no GPU is visible here and gpu_memory_gib is unset: the memory estimate was skipped"]
    plan = plan_memory(cfg, gpu_gib)
    if not plan.columns:
        return ["memory estimate skipped: " + "; ".join(plan.notes)]
    print(f"[roll] memory estimate: {summary_line(plan)}", flush=True)
    if plan.fits:
        return []
    line = refusal(cfg, plan)
    if cfg.memory_check == "refuse":
        raise MemoryPlanError(line)
    return [f"memory: {line}"]


def format_plan(plan: MemoryPlan, source: str) -> str:
    """The table of ``roll doctor``: a row per term, a column per GPU group and phase, the totals against the GPU,
    then how each role was counted."""
    header = ["term"] + [f"{c.where} {c.phase}" for c in plan.columns]
    rows = [header]
    for name in ROWS:
        values = [c.row(name) for c in plan.columns]
        rows.append([name] + ["-" if v is None else f"{v:.1f}" for v in values])
    rows.append(["total"] + [f"{c.total:.1f}" for c in plan.columns])
    rows.append(["free"] + [f"{plan.gpu_gib - c.total:.1f}" for c in plan.columns])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [f"GiB per GPU, against {plan.gpu_gib:.1f} GiB ({source})"]
    lines += [
        "  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(r, widths))) for r in rows
    ]
    for role, m in plan.roles.items():
        working = ", ".join(f"{t.what} {t.gib:.1f}" for t in m.working if t.gib > 0)
        lines.append(f"  {role} ({m.strategy}): {m.summary}" + (f"; at its peak: {working}" if working else ""))
    lines += [f"  note: {n}" for n in plan.notes]
    peak = plan.peak()
    verdict = "fits" if plan.fits else "does not fit"
    lines.append(
        f"verdict: {verdict}: peak {peak.total:.1f} GiB on {peak.where} in the {peak.phase} phase, "
        f"{'<=' if plan.fits else '>'} {plan.gpu_gib:.1f} GiB"
    )
    return "\n".join(lines)


@dataclass(frozen=True)
class MemoryVerdict:
    """The doctor's row on memory: fits (True), does not fit (False) or not estimated (None), with what was found
    and the fix."""

    fits: bool | None
    found: str
    fix: str = ""
    note: str = ""


def doctor_report(cfg: Any, flag_gib: float | None) -> tuple[str, MemoryVerdict] | None:
    """``(table, verdict)`` for ``roll doctor``; None for a CPU run (no GPU roles)."""
    if not gpu_workers(cfg):
        return None
    gpu_gib, source = gpu_memory(cfg, flag_gib)
    if gpu_gib is None:
        return "", MemoryVerdict(
            None,
            "GPU memory unknown",
            "add --gpu-memory-gib <GiB per GPU>",
            "no GPU is visible here: give the memory of the GPUs you plan for (e.g. 79.2 for an 80 GB H100)",
        )
    plan = plan_memory(cfg, gpu_gib)
    if not plan.columns:
        return "", MemoryVerdict(None, "not estimated", note="; ".join(plan.notes))
    peak = plan.peak()
    found = f"{peak.total:.1f} GiB on {peak.where} ({peak.phase})"
    if plan.fits:
        return format_plan(plan, source), MemoryVerdict(True, found)
    return format_plan(plan, source), MemoryVerdict(False, found, note=refusal(cfg, plan))
