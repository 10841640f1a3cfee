"""Placement: ``device_mapping`` -> Ray placement groups, GPU assignment per worker, colocation phases.

GPU runs: every GPU id named by any role gets one bundle ``{"GPU": 1, "CPU": c}``; the bundles of one node
(global id ``g`` lives on node ``g // num_gpus_per_node``, local index ``g % num_gpus_per_node``) form one
``STRICT_PACK`` placement group, so local indices are consistent inside a node. Worker ``r`` of a role owns GPUs
``device_mapping[r*k:(r+1)*k]`` (``k = num_gpus_per_worker``); its actor is scheduled in the bundle of its first
GPU with a fractional GPU request (``1 / workers starting on that GPU``) and sets ``CUDA_VISIBLE_DEVICES`` itself
to the local indices of all its GPUs, counted among the GPUs its node's raylet sees (:func:`visible_devices`).
Roles whose mappings overlap are *colocated* (time-shared: the one not in the current phase offloads its states);
disjoint mappings are *disaggregated*.

CPU runs (empty mappings): ``world_size`` workers per role, one placement group per role with one
``{"CPU": num_cpus_per_worker}`` bundle per worker.

Weight sync follows placement (:func:`weight_sync_mode`): disaggregated actor_train / actor_infer (disjoint GPUs,
Ray) broadcast over NCCL, colocated ones share buckets by CUDA IPC (:func:`ipc_routes`: which trainer rank serves
each engine GPU), everything else copies.

Every request is checked against the cluster's resources before any actor exists, and placement groups are awaited
with a timeout, so an unsatisfiable config fails fast with a message that names what is missing.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from roll.config.worker import WorkerConfig

#: Environment variable that stops Ray from overwriting ``CUDA_VISIBLE_DEVICES`` in an actor.
NOSET_CUDA = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
#: Environment variable carrying a GPU worker's node-local GPU indices into its actor (:func:`visible_devices`).
LOCAL_GPUS = "ROLL_LOCAL_GPU_IDS"


def visible_devices(local_ids: str, node_visible: str | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a worker with node-local GPU indices ``local_ids`` (``"0,1"``).

    The indices count the GPUs that the node's Ray exposes. Where its raylet was started with
    ``CUDA_VISIBLE_DEVICES`` itself (``node_visible``: a shared machine, or two ``ray start`` nodes on one host, one
    GPU each), index ``i`` is the ``i``-th entry of that list, not physical GPU ``i``."""
    ids = [int(i) for i in local_ids.split(",") if i.strip()]
    exposed = [d.strip() for d in (node_visible or "").split(",") if d.strip()]
    if not exposed:
        return ",".join(map(str, ids))
    if ids and max(ids) >= len(exposed):
        raise RuntimeError(
            f"worker needs node-local GPU {max(ids)} but its node exposes only "
            f"CUDA_VISIBLE_DEVICES={node_visible}: lower the ids in device_mapping or num_gpus_per_node"
        )
    return ",".join(exposed[i] for i in ids)


@dataclass(frozen=True)
class WorkerSlot:
    """Where one worker runs: global GPU ids (empty on CPU), its node-local indices, and its Ray request."""

    rank: int
    gpu_ids: tuple[int, ...]
    local_gpu_ids: tuple[int, ...]
    num_gpus: float  # fractional request in the bundle of gpu_ids[0] (0 on CPU)
    num_cpus: float
    bundle: int  # index of the bundle inside its placement group
    group_key: str  # which placement group: "node<N>" (GPU) or the role name (CPU)


@dataclass
class PlacementPlan:
    """Worker slots per role, plus which roles share GPUs."""

    roles: dict[str, list[WorkerSlot]]
    bundles: dict[str, list[dict[str, float]]]  # placement group key -> bundle resources
    colocated: dict[str, set[str]] = field(default_factory=dict)  # role -> other roles sharing a GPU with it

    @property
    def on_gpu(self) -> bool:
        return any(slot.gpu_ids for slots in self.roles.values() for slot in slots)

    def needed(self) -> dict[str, float]:
        """Total resources of all bundles: ``{"CPU": x, "GPU": y}``."""
        total: dict[str, float] = defaultdict(float)
        for bundles in self.bundles.values():
            for b in bundles:
                for k, v in b.items():
                    total[k] += v
        return dict(total)

    def describe(self) -> str:
        """One line per role: workers, GPUs, colocated roles."""
        lines = []
        for role, slots in self.roles.items():
            gpus = [list(s.gpu_ids) for s in slots] if self.on_gpu else "cpu"
            peers = sorted(self.colocated.get(role, ()))
            lines.append(
                f"{role}: {len(slots)} worker(s), gpus {gpus}"
                + (f", colocated with {', '.join(peers)}" if peers else "")
            )
        return "; ".join(lines)


def plan_placement(roles: dict[str, WorkerConfig], num_gpus_per_node: int) -> PlacementPlan:
    """Slots for every role from its (already validated) ``device_mapping`` / ``world_size``."""
    gpu_roles = {r: w for r, w in roles.items() if w.device_mapping}
    if gpu_roles and len(gpu_roles) != len(roles):
        cpu = sorted(set(roles) - set(gpu_roles))
        raise ValueError(
            f"roles {cpu} have no device_mapping while {sorted(gpu_roles)} do; on a GPU run give every "
            f"role a device_mapping (overlapping ids colocate roles)"
        )
    if not gpu_roles:
        return _plan_cpu(roles)
    return _plan_gpu(gpu_roles, max(1, num_gpus_per_node))


def _plan_cpu(roles: dict[str, WorkerConfig]) -> PlacementPlan:
    plan = PlacementPlan(roles={}, bundles={})
    for role, w in roles.items():
        plan.roles[role] = [WorkerSlot(r, (), (), 0.0, w.num_cpus_per_worker, r, role) for r in range(w.world_size)]
        plan.bundles[role] = [{"CPU": w.num_cpus_per_worker} for _ in range(w.world_size)]
    return plan


def _plan_gpu(roles: dict[str, WorkerConfig], per_node: int) -> PlacementPlan:
    owners: dict[int, list[tuple[str, int]]] = defaultdict(list)  # first GPU -> (role, rank) starting there
    users: dict[int, set[str]] = defaultdict(set)  # GPU -> roles using it
    spans: dict[str, list[tuple[int, ...]]] = {}
    for role, w in roles.items():
        k = w.num_gpus_per_worker
        spans[role] = [tuple(w.device_mapping[i : i + k]) for i in range(0, len(w.device_mapping), k)]
        for rank, gpus in enumerate(spans[role]):
            if len({g // per_node for g in gpus}) > 1:
                raise ValueError(
                    f"{role} worker {rank} spans GPUs {list(gpus)} on several nodes "
                    f"(num_gpus_per_node={per_node}); a worker's GPUs must share a node"
                )
            owners[gpus[0]].append((role, rank))
            for g in gpus:
                users[g].add(role)
    all_gpus = sorted(users)
    bundle_index: dict[int, tuple[str, int]] = {}
    bundles: dict[str, list[dict[str, float]]] = defaultdict(list)
    for g in all_gpus:
        key = f"node{g // per_node}"
        cpus = sum(roles[r].num_cpus_per_worker for r, _ in owners.get(g, []))
        bundle_index[g] = (key, len(bundles[key]))
        bundles[key].append({"GPU": 1.0, "CPU": float(cpus)})
    plan = PlacementPlan(roles={}, bundles=dict(bundles))
    for role, w in roles.items():
        slots = []
        for rank, gpus in enumerate(spans[role]):
            key, index = bundle_index[gpus[0]]
            share = len(owners[gpus[0]])
            slots.append(
                WorkerSlot(
                    rank, gpus, tuple(g % per_node for g in gpus), _fraction(share), w.num_cpus_per_worker, index, key
                )
            )
        plan.roles[role] = slots
        plan.colocated[role] = {r for g in w.device_mapping for r in users[g]} - {role}
    return plan


def _fraction(share: int) -> float:
    """1/share rounded down to 1e-4 so that ``share`` requests always fit one GPU."""
    return int(10_000 / share) / 10_000


def check_feasible(plan: PlacementPlan, have: dict[str, float]) -> None:
    """Raise before any actor exists when the cluster lacks what ``plan`` needs; names each shortfall."""
    need = plan.needed()
    missing = []
    if need.get("GPU", 0) > have.get("GPU", 0):
        missing.append(
            f"{need['GPU']:g} GPUs (the union of all device_mapping ids), the cluster has "
            f"{have.get('GPU', 0):g}: lower the ids in device_mapping or add GPUs (num_gpus_per_node)"
        )
    if need.get("CPU", 0) > have.get("CPU", 0):
        missing.append(
            f"{need['CPU']:g} CPUs (num_cpus_per_worker x workers, all roles), the cluster has "
            f"{have.get('CPU', 0):g}: lower num_cpus_per_worker / world_size or raise ray_num_cpus"
        )
    if missing:
        raise RuntimeError(f"cannot place the workers ({plan.describe()}): needs " + "; ".join(missing))


def create_placement_groups(plan: PlacementPlan, timeout_s: float = 60.0) -> dict[str, Any]:
    """One Ray placement group per key of ``plan.bundles``, each awaited for ``timeout_s``.

    A group that is not ready in time (infeasible: e.g. a node with fewer GPUs than its bundles) is removed and
    reported with the bundles it asked for."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    groups: dict[str, Any] = {}
    for key, bundles in plan.bundles.items():
        strategy = "STRICT_PACK" if key.startswith("node") else "PACK"
        groups[key] = placement_group(
            [{k: v for k, v in b.items() if v} or {"CPU": 0.01} for b in bundles], strategy=strategy, name=""
        )
    for key, pg in groups.items():
        ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
        if not ready:
            for g in groups.values():
                remove_placement_group(g)
            raise RuntimeError(
                f"placement group {key!r} with bundles {plan.bundles[key]} was not ready after "
                f"{timeout_s:g} s; the cluster has {ray.available_resources()} available. "
                f"{'All GPUs of a node group must sit on one node. ' if key.startswith('node') else ''}"
                f"Free resources or change device_mapping / world_size / num_cpus_per_worker."
            )
    return groups


def nccl_sync_blocker(mappings: dict[str, list[int]], distributed: str, infer_supports_group: bool) -> str | None:
    """Why actor_train -> actor_infer weights cannot go by NCCL broadcast here (None: they can).

    ``mappings``: ``device_mapping`` per role (``actor_train``, ``actor_infer`` and any other). NCCL needs the two
    roles in separate processes on separate GPUs: a Ray run (``distributed=local`` keeps every role in one process,
    without GPU isolation), GPU mappings on both sides, no GPU in both (NCCL cannot put two ranks of one group on one
    GPU), an inference strategy that receives broadcasts, and no other role on actor_infer's GPUs (the engine
    releases its memory while a colocated role runs, and a released engine cannot receive)."""
    train, infer = set(mappings.get("actor_train") or []), set(mappings.get("actor_infer") or [])
    if not infer_supports_group:
        return "actor_infer's strategy cannot receive weights by broadcast (only sglang can)"
    if distributed != "ray":
        return f"distributed={distributed} runs every role in one process without GPU isolation"
    if not train or not infer:
        return "a CPU run (no device_mapping) has no GPUs to connect"
    if train & infer:
        return f"GPUs {sorted(train & infer)} are in both actor_train's and actor_infer's device_mapping (colocated)"
    for role, mapping in mappings.items():
        if role not in ("actor_train", "actor_infer") and infer & set(mapping or []):
            return (
                f"actor_infer shares GPUs {sorted(infer & set(mapping))} with {role}, so its engine is released "
                f"while {role} runs"
            )
    return None


#: Values of sglang's ``weight_sync`` key.
SYNC_REQUESTS = ("auto", "nccl", "cuda_ipc", "copy")


def ipc_sync_blocker(
    mappings: dict[str, list[int]], distributed: str, infer_supports_ipc: bool, infer_in_subprocess: bool
) -> str | None:
    """Why actor_train's weights cannot reach actor_infer by CUDA IPC here (None: they can).

    CUDA IPC shares a GPU buffer between processes on that GPU, so every GPU of actor_infer must also hold an
    actor_train rank (colocated), the inference strategy must open shared buckets, and the receiver must live in
    another process than the trainer (Ray; or an engine with processes of its own, such as SGLang's: a process
    cannot open its own IPC handle)."""
    train, infer = set(mappings.get("actor_train") or []), set(mappings.get("actor_infer") or [])
    if not infer_supports_ipc:
        return "actor_infer's strategy cannot open CUDA-IPC buckets"
    if not train or not infer:
        return "a CPU run (no device_mapping) has no GPU buffers to share"
    if not infer <= train:
        return (
            f"actor_infer GPUs {sorted(infer - train)} hold no actor_train rank (CUDA IPC shares a buffer "
            f"within one GPU)"
        )
    if distributed != "ray" and not infer_in_subprocess:
        return f"distributed={distributed} keeps trainer and receiver in one process (weights are passed directly)"
    return None


def weight_sync_mode(
    mappings: dict[str, list[int]],
    distributed: str,
    infer_supports_group: bool,
    requested: str = "auto",
    infer_supports_ipc: bool = False,
    infer_in_subprocess: bool = False,
) -> tuple[str, str]:
    """``(mode, reason)`` of the actor_train -> actor_infer weight sync (``mappings``: ``device_mapping`` per role).

    - ``cuda_ipc``: colocated on GPUs; each trainer rank flattens a bucket on its GPU and the engines load it
      through one CUDA IPC handle per bucket (:mod:`roll.weights.ipc`): no host copy;
    - ``nccl``: disaggregated; trainer rank 0 broadcasts the buckets to the engines in a weight group;
    - ``direct``: ``distributed=local``; the receiver loads the trainer's tensors in the same process;
    - ``copy``: the fallback: weights gathered to CPU, through the Ray object store, into every receiver.
    ``requested`` (sglang ``strategy_config.weight_sync``): ``auto`` picks the first of the above that works here;
    naming a mode that cannot work raises ValueError."""
    if requested not in SYNC_REQUESTS:
        raise ValueError(f"weight_sync={requested!r}: expected one of {', '.join(SYNC_REQUESTS)}")
    if requested == "copy":
        return "copy", "weight_sync: copy requested"
    ipc = ipc_sync_blocker(mappings, distributed, infer_supports_ipc, infer_in_subprocess)
    nccl = nccl_sync_blocker(mappings, distributed, infer_supports_group)
    for mode, blocker in (("cuda_ipc", ipc), ("nccl", nccl)):
        if requested == mode and blocker:
            raise ValueError(f"weight_sync: {mode} is impossible here: {blocker}; use weight_sync: auto or copy")
    if requested in ("auto", "cuda_ipc") and ipc is None:
        return "cuda_ipc", f"actor_infer GPUs {sorted(set(mappings['actor_infer']))} each hold an actor_train rank"
    if nccl is None:
        return "nccl", (
            f"actor_infer GPUs {sorted(mappings['actor_infer'])} are disjoint from actor_train GPUs "
            f"{sorted(mappings['actor_train'])}"
        )
    if distributed == "local":
        return "direct", "distributed=local: trainer and receiver share this process"
    return "copy", f"no zero-copy path: {ipc}; and no NCCL broadcast: {nccl}"


def ipc_routes(mappings: dict[str, list[int]], gpus_per_infer_worker: int) -> list[list[int]]:
    """For each actor_infer worker, the actor_train rank on each of its GPUs (in the worker's GPU order), what a
    ``cuda_ipc`` sync hands each engine; empty on CPU. Trainer rank r runs on ``actor_train.device_mapping[r]``."""
    train, infer = list(mappings.get("actor_train") or []), list(mappings.get("actor_infer") or [])
    rank_of = {gpu: rank for rank, gpu in enumerate(train)}
    k = max(1, gpus_per_infer_worker)
    return [[rank_of.get(g, 0) for g in infer[i : i + k]] for i in range(0, len(infer), k)]


def role_mappings(cfg: Any) -> dict[str, list[int]]:
    """``device_mapping`` of every configured role of ``cfg`` (empty lists on CPU)."""
    from roll.config.validation import worker_blocks

    return {role: list(worker.device_mapping or []) for role, worker in worker_blocks(cfg).items()}
