"""Placement plans from device_mapping (no Ray needed): bundles, GPU shares, colocation, phases, feasibility."""

from __future__ import annotations

from pathlib import Path

import pytest

from roll.config.worker import WorkerConfig
from roll.distributed.colocation import ColocationPhases
from roll.distributed.placement import check_feasible, plan_placement


def _w(mapping=None, world_size=1, gpus_per_worker=1, cpus=1.0) -> WorkerConfig:
    w = WorkerConfig()
    w.device_mapping, w.world_size = mapping or [], world_size
    w.num_gpus_per_worker, w.num_cpus_per_worker = gpus_per_worker, cpus
    if mapping:
        w.world_size = len(mapping) // gpus_per_worker
    return w


def test_cpu_plan_uses_world_size():
    plan = plan_placement({"actor_train": _w(world_size=2, cpus=2), "actor_infer": _w(cpus=1)}, 0)
    assert not plan.on_gpu
    assert [s.rank for s in plan.roles["actor_train"]] == [0, 1]
    assert plan.bundles == {"actor_train": [{"CPU": 2}, {"CPU": 2}], "actor_infer": [{"CPU": 1}]}
    assert plan.needed() == {"CPU": 5}
    assert plan.colocated == {}


def test_colocated_roles_share_bundles():
    # train on GPUs 0-3, infer (TP=2) on 0-3, reference on 0-1: everything overlaps
    plan = plan_placement(
        {"actor_train": _w([0, 1, 2, 3]), "actor_infer": _w([0, 1, 2, 3], gpus_per_worker=2), "reference": _w([0, 1])},
        num_gpus_per_node=8,
    )
    assert plan.bundles == {
        "node0": [
            {"GPU": 1.0, "CPU": 3.0},
            {"GPU": 1.0, "CPU": 2.0},
            {"GPU": 1.0, "CPU": 2.0},
            {"GPU": 1.0, "CPU": 1.0},
        ]
    }
    infer = plan.roles["actor_infer"]
    assert [s.gpu_ids for s in infer] == [(0, 1), (2, 3)]
    assert [s.bundle for s in infer] == [0, 2]
    # GPU 0 starts three workers (train 0, infer 0, reference 0): each asks for a third of it
    assert plan.roles["actor_train"][0].num_gpus == pytest.approx(0.3333)
    assert plan.roles["actor_train"][1].num_gpus == pytest.approx(0.5)  # GPU 1: train 1 and reference 1
    assert plan.roles["actor_train"][3].num_gpus == 1.0
    assert plan.colocated["actor_train"] == {"actor_infer", "reference"}
    assert plan.colocated["reference"] == {"actor_train", "actor_infer"}
    assert plan.needed()["GPU"] == 4


def test_disaggregated_roles_and_nodes():
    plan = plan_placement({"actor_train": _w([0, 1, 2, 3]), "actor_infer": _w([4, 5, 6, 7])}, num_gpus_per_node=4)
    assert plan.colocated == {"actor_train": set(), "actor_infer": set()}
    assert set(plan.bundles) == {"node0", "node1"}
    slot = plan.roles["actor_infer"][1]
    assert (slot.gpu_ids, slot.local_gpu_ids, slot.group_key, slot.bundle, slot.num_gpus) == (
        (5,),
        (1,),
        "node1",
        1,
        1.0,
    )


def test_worker_across_nodes_and_mixed_cpu_gpu_rejected():
    with pytest.raises(ValueError, match="spans GPUs \\[1, 2\\] on several nodes"):
        plan_placement({"actor_infer": _w([1, 2], gpus_per_worker=2), "actor_train": _w([0])}, num_gpus_per_node=2)
    with pytest.raises(ValueError, match="no device_mapping"):
        plan_placement({"actor_train": _w([0]), "actor_infer": _w()}, num_gpus_per_node=1)


def test_feasibility_names_what_is_missing():
    plan = plan_placement({"actor_train": _w([0, 1, 2, 3]), "actor_infer": _w([0, 1, 2, 3])}, 8)
    with pytest.raises(RuntimeError, match=r"4 GPUs .*the cluster has 1") as err:
        check_feasible(plan, {"CPU": 64, "GPU": 1})
    assert "CPUs" not in str(err.value)
    with pytest.raises(RuntimeError, match=r"8 CPUs .*the cluster has 2"):
        check_feasible(plan, {"CPU": 2, "GPU": 8})
    check_feasible(plan, {"CPU": 8, "GPU": 4})


class _Recorder:
    def __init__(self, role, log):
        self.role, self.log = role, log

    def call(self, method):
        self.log.append((self.role, method))


def test_colocation_phases_offload_then_reload():
    plan = plan_placement({"actor_train": _w([0]), "actor_infer": _w([0]), "reference": _w([1])}, 2)
    log: list = []
    groups = {r: _Recorder(r, log) for r in plan.roles}
    phases = ColocationPhases(plan.colocated)
    assert phases.activate(groups, {"actor_infer"}) == [("actor_train", "offload")]
    assert phases.activate(groups, {"actor_infer"}) == []  # already in that phase
    # back to training: infer offloads first (frees memory), then train reloads; reference (GPU 1) never moves
    assert phases.activate(groups, {"actor_train", "reference", "critic"}) == [
        ("actor_infer", "offload"),
        ("actor_train", "reload"),
    ]
    assert log == [
        ("actor_train", "offload_states"),
        ("actor_infer", "offload_states"),
        ("actor_train", "reload_states"),
    ]


def test_cpu_phases_never_offload():
    plan = plan_placement({"actor_train": _w(), "actor_infer": _w()}, 0)
    log: list = []
    phases = ColocationPhases(plan.colocated)
    assert phases.activate({r: _Recorder(r, log) for r in plan.roles}, {"actor_infer"}) == []
    assert log == []


class _Measured(_Recorder):
    """A role whose rank 0 reports GPU memory like ``Worker.memory_stats`` (GiB)."""

    def __init__(self, role, log, stats):
        super().__init__(role, log)
        self.stats = stats

    def call_rank0(self, method):
        assert method == "memory_stats"
        return dict(self.stats)


@pytest.mark.parametrize("trainer_peak, resident", [(30.0, True), (60.0, False)])
def test_auto_policy_stays_resident_when_measured_to_fit(trainer_peak, resident):
    """80 GiB GPU; the engine uses 30 GiB. A 30 GiB trainer peak fits (30 + 30 + 2 + 4 = 66 <= 80): from the
    second rollout on nothing moves. A 60 GiB peak does not (96 > 80): offloading goes on."""
    plan = plan_placement({"actor_train": _w([0]), "actor_infer": _w([0])}, 1)
    log: list = []
    train = _Measured(
        "actor_train",
        log,
        {"reserved_gib": 0.5, "gpu_used_gib": 30.5, "gpu_total_gib": 80.0, "peak_reserved_gib": trainer_peak},
    )
    groups = {"actor_train": train, "actor_infer": _Recorder("actor_infer", log)}
    phases = ColocationPhases(plan.colocated, "auto")
    phases.activate(groups, {"actor_infer"})  # first rollout: like "always"
    phases.activate(groups, {"actor_train"})  # training: the engine's 30 GiB are measured, then it is released
    assert phases.rollout_gib == pytest.approx(30.0) and phases.decision is None
    log.clear()
    calls = phases.activate(groups, {"actor_infer"})  # second rollout: decide
    assert phases.resident == resident and ("do not fit" in phases.decision) != resident
    if resident:
        assert calls == [("actor_infer", "reload")]  # the trainer stays; the engine comes back
        assert phases.activate(groups, {"actor_train"}) == [] and phases.activate(groups, {"actor_infer"}) == []
    else:
        assert calls == [("actor_train", "offload"), ("actor_infer", "reload")]


def test_auto_policy_does_not_judge_by_the_warm_start():
    """The warm start's training phase (``measure=False``) is not measured: the decision waits for the first RL
    update's phase, whose peak (here 60 GiB, against the warm start's 30) decides: offloading goes on."""
    plan = plan_placement({"actor_train": _w([0]), "actor_infer": _w([0])}, 1)
    log: list = []
    stats = {"reserved_gib": 0.5, "gpu_used_gib": 30.5, "gpu_total_gib": 80.0, "peak_reserved_gib": 30.0}
    groups = {"actor_train": _Measured("actor_train", log, stats), "actor_infer": _Recorder("actor_infer", log)}
    phases = ColocationPhases(plan.colocated, "auto")
    phases.activate(groups, {"actor_train"}, measure=False)  # warm start
    phases.activate(groups, {"actor_infer"})  # first rollout: nothing measured yet, nothing decided
    assert phases.rollout_gib is None and phases.decision is None
    phases.activate(groups, {"actor_train"})  # the RL update: the engine's 30 GiB measured
    groups["actor_train"].stats["peak_reserved_gib"] = 60.0
    phases.activate(groups, {"actor_infer"})
    assert not phases.resident and "do not fit" in phases.decision


def test_never_policy_moves_nothing_and_bad_policy_is_named():
    plan = plan_placement({"actor_train": _w([0]), "actor_infer": _w([0])}, 1)
    log: list = []
    phases = ColocationPhases(plan.colocated, "never")
    groups = {r: _Recorder(r, log) for r in plan.roles}
    assert phases.activate(groups, {"actor_infer"}) == [] and phases.activate(groups, {"actor_train"}) == []
    with pytest.raises(ValueError, match="colocated_offload='sometimes'"):
        ColocationPhases(plan.colocated, "sometimes")


def test_visible_devices_count_the_gpus_the_node_exposes():
    from roll.distributed.placement import visible_devices

    assert visible_devices("0,1", None) == "0,1"  # a raylet that sees every GPU: index = physical id
    assert visible_devices("1", "") == "1"
    assert visible_devices("0", "1") == "1"  # the second `ray start` of a host, started with CUDA_VISIBLE_DEVICES=1
    assert visible_devices("1,0", "4, 6") == "6,4"
    assert visible_devices("0", "GPU-ab12,GPU-cd34") == "GPU-ab12"
    with pytest.raises(RuntimeError, match="node-local GPU 2 but its node exposes only CUDA_VISIBLE_DEVICES=3,5"):
        visible_devices("2", "3,5")


@pytest.mark.slow
def test_gpu_worker_on_a_raylet_started_with_cuda_visible_devices(monkeypatch, tiny_model_dir):
    """A real Worker actor in a GPU slot (Ray told the raylet it has 2 GPUs; none exist here): its CUDA_VISIBLE_DEVICES
    is the slot's node-local index counted in the raylet's own list, not the physical index (the old behaviour gave
    "1" here, i.e. another tenant's GPU on a shared machine, or the head's GPU for a second `ray start` on one host)."""
    ray = pytest.importorskip("ray")
    from roll.config.loader import load_config
    from roll.distributed.group import RayWorkerGroup
    from roll.distributed.placement import create_placement_groups

    if ray.is_initialized():
        ray.shutdown()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")  # the raylet started below inherits it
    root = str(Path(__file__).resolve().parents[2])
    ray.init(
        address="local",  # a new instance, also where another run's Ray is up on this machine
        num_cpus=2,
        num_gpus=2,
        include_dashboard=False,
        runtime_env={"env_vars": {"PYTHONPATH": root}},
    )
    try:
        config = load_config("sokoban_tiny", overrides=[f"pretrain={tiny_model_dir}", "tiny_model=null"]).actor_infer
        config.device_mapping, config.world_size, config.num_cpus_per_worker = [1], 1, 1
        plan = plan_placement({"actor_infer": config}, num_gpus_per_node=2)
        groups = create_placement_groups(plan)
        group = RayWorkerGroup(
            "actor_infer", config, timeout_s=120, gpu_ids=[1], slots=plan.roles["actor_infer"], placement_groups=groups
        )
        env = ray.get(group.actors[0].__ray_call__.remote(lambda w: dict(__import__("os").environ)))
        assert env["CUDA_VISIBLE_DEVICES"] == "7"
        assert "ROLL_LOCAL_GPU_IDS" not in env
    finally:
        ray.shutdown()
