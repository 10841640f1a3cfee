"""Time-sharing of roles colocated on GPUs: who frees memory between phases, and when nothing has to move.

Phases: the rollout phase runs ``actor_infer``; the training phase runs ``actor_train`` (and ``reference``,
``critic``). Before a phase, :meth:`ColocationPhases.activate` offloads the idle roles that share a GPU with an
active one (``offload_states``: the trainer moves parameters, gradients and optimizer states to CPU memory; an SGLang
engine releases its weights, KV cache and CUDA graphs) and reloads the active ones. The weight sync after training
needs only the engine's weights back (the engine resumes them itself, see ``SGLangStrategy.load_weight_bucket``).

``colocated_offload`` (config) says whether idle roles offload:

- ``always``: every phase switch offloads the idle colocated roles;
- ``never``: nothing moves; the GPU must hold every role at its peak;
- ``auto`` (default): start as ``always`` and measure: during the first training phase the GPU memory in use by the
  rollout roles (GPU-wide use minus the training roles' own reserved memory, measured in a training role's process
  while they are offloaded), after it the training roles' peak reserved memory (the first RL update's phase: the
  supervised warm start is not measured; on an H200 a Qwen2.5-VL-3B warm start peaked at 91 GiB, its RL update
  went out of memory beside the resident engine at 106 GiB in use). If the two plus a margin
  (:data:`MARGIN_FRACTION` of the GPU + :data:`MARGIN_GIB`) fit the GPU, switch to resident: nothing moves
  afterwards. The decision is printed, and ``time/offload_reload`` drops to ~0.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

#: Head-room kept free when ``auto`` decides that the roles fit together: a fraction of the GPU plus a constant.
MARGIN_FRACTION = 0.05
MARGIN_GIB = 2.0
POLICIES = ("auto", "always", "never")
ROLLOUT_ROLES = frozenset({"actor_infer"})


class ColocationPhases:
    """Offload/reload of colocated roles around phases (see the module docstring). A no-op on CPU and for roles
    that share no GPU."""

    def __init__(self, colocated: dict[str, set[str]], policy: str = "always"):
        if policy not in POLICIES:
            raise ValueError(f"colocated_offload={policy!r}: expected one of {', '.join(POLICIES)}")
        self.colocated, self.policy = colocated, policy
        self.offloaded: set[str] = set()
        self.resident = policy == "never"
        self.rollout_gib: float | None = None  # GPU memory the rollout roles use (auto)
        self.decision: str | None = None

    def activate(self, groups: dict[str, Any], active: Iterable[str], measure: bool = True) -> list[tuple[str, str]]:
        """Offload the idle colocated roles first (freeing memory), then reload the active ones; returns the
        ``(role, "offload" | "reload")`` calls made, in order. ``measure=False``: a training phase ``auto`` does not
        judge by (the supervised warm start: its batches are not the RL update's, whose peak can be larger)."""
        active = {r for r in active if r in groups}
        idle = {peer for r in active for peer in self.colocated.get(r, ())} - active
        if self.policy == "auto" and not self.resident and self.decision is None and idle and measure:
            self._measure(groups, active, idle)
        calls: list[tuple[str, str]] = []
        if not self.resident:
            for role in sorted(idle - self.offloaded):
                if role in groups:
                    groups[role].call("offload_states")
                    self.offloaded.add(role)
                    calls.append((role, "offload"))
        for role in sorted((active | (set(groups) if self.resident else set())) & self.offloaded):
            groups[role].call("reload_states")
            self.offloaded.discard(role)
            calls.append((role, "reload"))
        return calls

    def _measure(self, groups: dict[str, Any], active: set[str], idle: set[str]) -> None:
        """``auto``: record what the rollout roles use when training starts; decide when the rollout resumes."""
        trainers = sorted(r for r in (active | idle) if r not in ROLLOUT_ROLES and r in groups)
        if not trainers:
            return
        stats = {r: groups[r].call_rank0("memory_stats") for r in trainers}
        probe = stats[trainers[0]]
        if not probe:
            return  # CPU
        if active & ROLLOUT_ROLES:  # back to rollout after training: the trainers' peaks are known
            if self.rollout_gib is None:
                return
            peak = sum(s.get("peak_reserved_gib", 0.0) for s in stats.values())
            need = self.rollout_gib + peak + MARGIN_GIB + MARGIN_FRACTION * probe["gpu_total_gib"]
            fits = need <= probe["gpu_total_gib"]
            self.resident = fits
            self.decision = (
                f"rollout roles {self.rollout_gib:.1f} GiB + training roles' peak {peak:.1f} GiB + "
                f"margin = {need:.1f} GiB {'fit' if fits else 'do not fit'} the GPU's "
                f"{probe['gpu_total_gib']:.1f} GiB: colocated roles "
                f"{'stay resident (nothing moves between phases)' if fits else 'keep offloading'}"
            )
            print(f"[roll] colocated_offload=auto: {self.decision}", flush=True)
        else:  # training starts: the rollout roles are still resident, the trainers offloaded
            own = sum(s.get("reserved_gib", 0.0) for s in stats.values())
            self.rollout_gib = max(0.0, probe["gpu_used_gib"] - own)
