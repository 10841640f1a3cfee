"""Pipeline checkpoints: everything needed to continue a run exactly, written atomically.

Layout of ``<output_dir>/checkpoints/step_<N>/`` (written as ``.tmp-step_<N>`` and renamed when complete)::

    <role>/            backend checkpoint of each training role (DeepSpeed: model + optimizer + scheduler state,
                       ``optimizer_steps``), written by every rank of the role
    actor_hf/          the actor in Hugging Face format (``save_pretrained``), loadable by transformers; with LoRA a
                       peft adapter directory (and the role's checkpoint holds the adapter, not the base)
    rng_<role>.pt      RNG states (python, numpy, torch, CUDA) of every worker of every role, in rank order
    pipeline.pt        driver state: step, driver RNG, KL controller, tracker run id, rollout seed state
    COMPLETE           JSON marker written last; a directory without it is never resumed from

Rollout seeds are a pure function of ``(seed, phase, step, group)`` (see ``roll.agentic.env_manager``), so the
rollout seed state is the step counter plus the run seed, stored in ``pipeline.pt`` and checked on resume.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from roll.distributed.roles import Roles
from roll.distributed.worker import get_rng_state, set_rng_state
from roll.strategies.registry import TRAIN_ROLES

COMPLETE = "COMPLETE"
STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoints_root(output_dir: str | Path) -> Path:
    """``<output_dir>/checkpoints``."""
    return Path(output_dir) / "checkpoints"


def is_complete(path: str | Path) -> bool:
    """A checkpoint directory whose ``COMPLETE`` marker exists."""
    return (Path(path) / COMPLETE).is_file()


def list_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``output_dir`` as ``(step, path)``, oldest first."""
    root = checkpoints_root(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name)) and is_complete(p)]
    return sorted(found)


def resolve_resume(resume_from_checkpoint: Any, output_dir: str | Path) -> Path | None:
    """The checkpoint to resume from: ``true`` -> newest complete one in ``output_dir`` (None when there is none);
    a path -> that checkpoint, which must be complete; ``false`` / None / "" -> None."""
    if resume_from_checkpoint in (False, None, "", "false", "False"):
        return None
    if resume_from_checkpoint in (True, "true", "True"):
        found = list_checkpoints(output_dir)
        return found[-1][1] if found else None
    path = Path(str(resume_from_checkpoint))
    if not is_complete(path):
        raise ValueError(
            f"resume_from_checkpoint={str(resume_from_checkpoint)!r}: not a complete checkpoint (no "
            f"{COMPLETE} marker; an interrupted save is never resumed from). Complete ones in "
            f"{checkpoints_root(output_dir)}: {[str(p) for _, p in list_checkpoints(output_dir)]}"
        )
    return path


def save_checkpoint(
    output_dir: str | Path, step: int, roles: Roles, state: dict[str, Any], max_to_keep: int = 0
) -> Path:
    """Write checkpoint ``step`` atomically; ``state`` is the driver's (picklable) state. Keeps the newest
    ``max_to_keep`` complete checkpoints (0 = all). Returns the final directory."""
    start = time.perf_counter()
    root = checkpoints_root(output_dir)
    final, tmp = root / f"step_{step}", root / f".tmp-step_{step}"
    if tmp.exists():
        shutil.rmtree(tmp)  # leftovers of an interrupted save
    tmp.mkdir(parents=True)
    for role, proxy in roles.items():
        if role in TRAIN_ROLES:
            proxy.save_checkpoint(str(tmp / role))  # every rank writes its shard
    roles.actor_train.save_pretrained(str(tmp / "actor_hf"))
    for role, proxy in roles.items():
        torch.save(proxy.rng_states(), tmp / f"rng_{role}.pt")
    torch.save({**state, "step": step, "driver_rng": get_rng_state()}, tmp / "pipeline.pt")
    (tmp / COMPLETE).write_text(
        json.dumps({"step": step, "saved_at": time.time(), "seconds": time.perf_counter() - start})
    )
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)  # atomic on one filesystem: the step_N name only ever holds a complete checkpoint
    if max_to_keep > 0:
        for _, old in list_checkpoints(output_dir)[:-max_to_keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def read_state(path: str | Path) -> dict[str, Any]:
    """The driver state of checkpoint ``path`` (step, KL controller, tracker run id, ...)."""
    return torch.load(Path(path) / "pipeline.pt", weights_only=False)


def load_checkpoint(path: str | Path, roles: Roles) -> dict[str, Any]:
    """Restore training roles, every worker's RNG and the driver RNG from ``path``; returns the driver state.

    The caller then syncs the restored actor weights to the inference workers."""
    path = Path(path)
    if not is_complete(path):
        raise ValueError(f"{path} is not a complete checkpoint (no {COMPLETE} marker)")
    for role, proxy in roles.items():
        if role in TRAIN_ROLES:
            proxy.load_checkpoint(str(path / role))
    for role, proxy in roles.items():
        rng_file = path / f"rng_{role}.pt"
        if not rng_file.is_file():
            raise ValueError(
                f"{path} has no RNG states of role {role!r}; the checkpoint was written by a run with other roles"
            )
        states = torch.load(rng_file, weights_only=False)
        if len(states) != proxy.world_size:
            raise ValueError(
                f"{path}: role {role!r} was saved with {len(states)} workers, now {proxy.world_size}; "
                f"resume with the same world_size / device_mapping"
            )
        proxy.set_rng_states(states)
    state = read_state(path)
    set_rng_state(state["driver_rng"])
    return state
