"""actor_train -> actor_infer weight sync on CPU: the mode decision from device_mapping, its config checks, the
async calls of a local worker group, and :class:`WeightSync` end to end over local groups through the role proxies'
weight faces and the workers' endpoints (the broadcast path over a real gloo weight group between threads, with
engines of TP size 2; the copy, shared-memory and direct paths; the CUDA IPC orchestration with a stand-in for the
GPU-only payloads), and that every mode sends what the sender's one ``buckets`` method yields."""

from __future__ import annotations

import threading

import pytest
import torch

from roll.config.errors import ConfigError
from roll.config.loader import load_config
from roll.config.worker import GeneratingArgs
from roll.distributed.group import LocalWorkerGroup
from roll.distributed.placement import ipc_routes, nccl_sync_blocker, weight_sync_mode
from roll.distributed.roles import ActorProxy, InferProxy
from roll.distributed.worker import Worker
from roll.launch.preflight import check_strategy_options, check_weight_sync
from roll.launch.weight_sync import weight_sync
from roll.strategies.base import GenerationOutput
from roll.strategies.registry import strategy_spec
from roll.weights.buckets import BucketMeta, bucket_meta, iter_buckets, plan_buckets
from roll.weights.group import WeightGroup
from roll.weights.receiver import WeightReceiver
from roll.weights.sender import WeightSender
from roll.weights.sync import GROUP_NAME, WeightSync
from tests.config_cache import cached_config


# ---------------------------------------------------------------------------- mode decision
@pytest.mark.parametrize(
    "mappings, distributed, receives, mode, why",
    [
        ({"actor_train": [0], "actor_infer": [1]}, "ray", True, "nccl", "disjoint"),
        (
            {"actor_train": [0, 1, 2, 3], "actor_infer": [4, 5, 6, 7], "reference": [0, 1]},
            "ray",
            True,
            "nccl",
            "disjoint",
        ),
        ({"actor_train": [0], "actor_infer": [0]}, "ray", True, "copy", "GPUs [0] are in both"),
        (
            {"actor_train": [0, 1], "actor_infer": [1, 2]},
            "ray",
            True,
            "copy",
            "GPUs [1] are in both",
        ),  # partial overlap
        (
            {"actor_train": [0], "actor_infer": [1], "reference": [1]},
            "ray",
            True,
            "copy",
            "shares GPUs [1] with reference",
        ),
        ({"actor_train": [], "actor_infer": []}, "ray", True, "copy", "CPU run"),
        ({"actor_train": [0], "actor_infer": [1]}, "local", True, "direct", "distributed=local"),
        ({"actor_train": [0], "actor_infer": [1]}, "ray", False, "copy", "only sglang"),
    ],
)
def test_mode_from_device_mapping(mappings, distributed, receives, mode, why):
    got, reason = weight_sync_mode(mappings, distributed, receives)
    assert got == mode and why in reason
    assert (nccl_sync_blocker(mappings, distributed, receives) is None) == (mode == "nccl")


@pytest.mark.parametrize(
    "mappings, distributed, subprocess, mode, why",
    [
        ({"actor_train": [0], "actor_infer": [0]}, "ray", False, "cuda_ipc", "each hold an actor_train rank"),
        ({"actor_train": [0, 1], "actor_infer": [0, 1]}, "ray", True, "cuda_ipc", "each hold"),  # TP-2 colocated
        ({"actor_train": [0], "actor_infer": [0]}, "local", True, "cuda_ipc", "each hold"),  # sglang: own processes
        ({"actor_train": [0], "actor_infer": [0]}, "local", False, "direct", "share this process"),  # hf_infer local
        ({"actor_train": [0], "actor_infer": [0, 1]}, "ray", True, "copy", "GPUs [1] hold no actor_train rank"),
        ({"actor_train": [0], "actor_infer": [1]}, "ray", True, "nccl", "disjoint"),
        ({"actor_train": [], "actor_infer": []}, "ray", True, "copy", "CPU run"),
        ({"actor_train": [], "actor_infer": []}, "local", False, "direct", "share this process"),
    ],
)
def test_mode_with_cuda_ipc_receivers(mappings, distributed, subprocess, mode, why):
    got, reason = weight_sync_mode(mappings, distributed, True, infer_supports_ipc=True, infer_in_subprocess=subprocess)
    assert got == mode and why in reason
    with pytest.raises(ValueError, match="cuda_ipc is impossible here"):
        weight_sync_mode({"actor_train": [0], "actor_infer": [1]}, "ray", True, "cuda_ipc", True, True)


def test_ipc_routes_pick_the_trainer_rank_of_each_engine_gpu():
    assert ipc_routes({"actor_train": [0, 1], "actor_infer": [0, 1]}, 1) == [[0], [1]]  # one engine per GPU
    assert ipc_routes({"actor_train": [0, 1], "actor_infer": [0, 1]}, 2) == [[0, 1]]  # one TP-2 engine
    assert ipc_routes({"actor_train": [2, 3, 0, 1], "actor_infer": [0, 1, 2, 3]}, 2) == [[2, 3], [0, 1]]


def test_requested_mode_overrides_or_fails():
    disjoint, shared = {"actor_train": [0], "actor_infer": [1]}, {"actor_train": [0], "actor_infer": [0]}
    assert weight_sync_mode(disjoint, "ray", True, "copy")[0] == "copy"
    assert weight_sync_mode(disjoint, "ray", True, "nccl")[0] == "nccl"
    with pytest.raises(ValueError, match=r"nccl is impossible here: GPUs \[0\]"):
        weight_sync_mode(shared, "ray", True, "nccl")
    with pytest.raises(ValueError, match="'fast'"):
        weight_sync_mode(disjoint, "ray", True, "fast")


# ---------------------------------------------------------------------------- config checks
def _cfg(infer_strategy: str = "sglang", train_gpus=(0,), infer_gpus=(1,), distributed: str = "ray", **sc):
    """sokoban_tiny (loaded on CPU, with hf_infer), then turned into a GPU config (validation of the GPU keys
    runs below on its own: the full load would need SGLang installed)."""
    cfg = cached_config("sokoban_tiny", ("distributed=local", "tiny_model=null", "pretrain=/nonexistent"))
    cfg.distributed, cfg.num_gpus_per_node = distributed, 2
    cfg.actor_train.device_mapping, cfg.actor_infer.device_mapping = list(train_gpus), list(infer_gpus)
    cfg.actor_infer.strategy_args.strategy_name = infer_strategy
    cfg.actor_infer.strategy_args.strategy_config = dict(sc)
    return cfg


def test_config_checks_of_weight_sync():
    check_weight_sync(_cfg())  # disaggregated sglang: auto -> nccl, fine
    check_weight_sync(_cfg(weight_sync="nccl"))
    check_weight_sync(_cfg(train_gpus=(0,), infer_gpus=(0,), weight_sync="copy"))
    with pytest.raises(ConfigError, match=r"weight_sync='nccl': NCCL sync is impossible: GPUs \[0\] are in both"):
        check_weight_sync(_cfg(infer_gpus=(0,), weight_sync="nccl"))
    with pytest.raises(ConfigError, match="NCCL sync is impossible: distributed=local"):
        check_weight_sync(_cfg(distributed="local", weight_sync="nccl"))
    with pytest.raises(ConfigError, match="CUDA IPC sync is impossible: actor_infer GPUs \\[1\\] hold no actor_train"):
        check_weight_sync(_cfg(weight_sync="cuda_ipc"))
    check_weight_sync(_cfg(infer_gpus=(0,), weight_sync="cuda_ipc"))
    with pytest.raises(ConfigError, match="weight_sync='fast': must be one of auto, nccl, cuda_ipc, copy"):
        check_weight_sync(_cfg(weight_sync="fast"))
    with pytest.raises(
        ConfigError, match="weight_sync='copy': not a key of HFInferOptions; allowed: generate_batch_size"
    ):
        check_strategy_options(_cfg("hf_infer", weight_sync="copy"))  # it always receives weights by copy


def test_config_check_of_sglang_tp_size():
    cfg = _cfg(train_gpus=(0,), infer_gpus=(0, 1), tp_size=1)
    cfg.actor_infer.num_gpus_per_worker = 2
    with pytest.raises(ConfigError, match=r"tp_size=1: must equal actor_infer.num_gpus_per_worker \(2\)"):
        check_weight_sync(cfg)
    cfg.actor_infer.strategy_args.strategy_config["tp_size"] = 2
    check_weight_sync(cfg)  # TP 2 over GPUs 0-1, colocated with training on GPU 0: copy
    del cfg.actor_infer.strategy_args.strategy_config["tp_size"]
    check_weight_sync(cfg)  # tp_size defaults to num_gpus_per_worker


@pytest.mark.parametrize(
    "name, extra, mode",
    [
        ("sokoban_qwen05b_sglang_disagg", [], "nccl"),
        ("sokoban_qwen05b_sglang", [], "cuda_ipc"),
        (
            "sokoban_qwen05b_sglang",
            [
                "num_gpus_per_node=2",
                "actor_infer.device_mapping=[0,1]",  # the tp2 GPU check
                "actor_infer.num_gpus_per_worker=2",
                "+actor_infer.strategy_args.strategy_config.tp_size=2",
            ],
            "copy",
        ),
    ],
)
def test_gpu_example_configs_pick_their_mode(name, extra, mode):
    """The GPU examples validate (``ray_address`` set: the driver need not have SGLang) and pick their mode."""
    from roll.distributed.placement import role_mappings

    cfg = load_config(name, overrides=[*extra, "ray_address=auto", "pretrain=/nonexistent"])
    assert (
        weight_sync_mode(role_mappings(cfg), cfg.distributed, True, infer_supports_ipc=True, infer_in_subprocess=True)[
            0
        ]
        == mode
    )


def test_launch_decides_mode_buckets_and_tp(capsys):
    cfg = _cfg(infer_gpus=(1,), weight_bucket_bytes=4096)
    sync = weight_sync(cfg, sender=None, receiver=None)
    assert (sync.mode, sync.bucket_bytes, sync.engine_tp_size, sync.count_buckets) == ("nccl", 4096, 1, True)
    assert "weight sync actor_train -> actor_infer: nccl (actor_infer GPUs [1] are disjoint" in capsys.readouterr().out
    cfg = _cfg(infer_gpus=(0, 1), tp_size=2)
    cfg.actor_infer.num_gpus_per_worker = 2
    sync = weight_sync(cfg, sender=None, receiver=None)
    assert (sync.mode, sync.engine_tp_size) == ("copy", 2)
    hf = weight_sync(_cfg("hf_infer"), sender=None, receiver=None)
    assert (hf.mode, hf.engine_tp_size, hf.count_buckets) == ("copy", 1, False)
    hf = weight_sync(_cfg("hf_infer", infer_gpus=(0,), weight_bucket_bytes=8192), sender=None, receiver=None)
    assert (hf.mode, hf.bucket_bytes) == ("cuda_ipc", 8192)  # colocated hf_infer: its own bucket size option
    assert hf.ipc_routes == [[0]] and hf.shared_dir is None  # its engine's GPU holds trainer rank 0
    cpu = weight_sync(_cfg("hf_infer", train_gpus=(), infer_gpus=()), sender=None, receiver=None)
    assert (cpu.mode, cpu.shared_dir) == ("copy", "/dev/shm")  # a CPU Ray run on one machine: shared memory
    cpu = weight_sync(_cfg("hf_infer", train_gpus=(), infer_gpus=(), distributed="local"), sender=None, receiver=None)
    assert (cpu.mode, cpu.shared_dir) == ("direct", None)


# ---------------------------------------------------------------------------- async calls of a local group
class _Meeter:
    """A worker whose ``meet`` returns only when all parties of a barrier are inside (like an NCCL broadcast,
    which returns only when the sender and every receiver have posted it)."""

    def __init__(self, barrier: threading.Barrier):
        self.barrier, self.log = barrier, []

    def meet(self, tag: str) -> str:
        self.log.append(f"{tag}:in")
        self.barrier.wait()
        self.log.append(f"{tag}:out")
        return tag

    def note(self, tag: str) -> str:
        self.log.append(tag)
        return tag

    def fail(self) -> None:
        raise RuntimeError("worker failed")


def test_local_async_calls_overlap_and_keep_each_workers_order():
    barrier = threading.Barrier(3, timeout=10)  # a sequential call of the three would break it
    infer = LocalWorkerGroup.of("actor_infer", [_Meeter(barrier), _Meeter(barrier)])
    train = LocalWorkerGroup.of("actor_train", [_Meeter(barrier)])
    receiving = infer.call_async("meet", "recv")
    later = infer.call_each_async("note", {1: ("after",)})  # queued behind rank 1's meet
    sending = train.call_async("meet", "send")
    assert train.wait(sending) == ["send"]
    assert infer.wait(receiving) == ["recv", "recv"] and infer.wait(later) == ["after"]
    assert infer.workers[1].log == ["recv:in", "recv:out", "after"]
    assert infer.call_each_async("note", {}) == []
    with pytest.raises(RuntimeError, match="worker failed"):
        train.wait(train.call_async("fail"))


# ---------------------------------------------------------------------------- WeightSync over local groups
def _weights(shift: float = 0.0) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(f"layers.{i}.weight", torch.randn(6, 4, generator=g).to(torch.bfloat16) + shift) for i in range(5)]


class _Trainer:
    """A training strategy as far as the sender needs it: its weights, bucket by bucket (nothing else: a sync that
    read ``named_weights`` or a strategy plan would fail here)."""

    def __init__(self):
        self.weights = _weights()

    def weight_buckets(self, bucket_bytes: int):
        yield from iter_buckets(self.weights, bucket_bytes)


class _Engine:
    """A receiving strategy like sglang's: ``tp`` ranks (threads here, processes in SGLang), each receiving the
    full tensors in the weight group; CUDA IPC buckets arrive as the stand-in payloads of :func:`_fake_share`."""

    def __init__(self, tp: int):
        self.tp, self.groups, self.joins, self.weights, self.buckets = tp, [], [], {}, []

    def _each_rank(self, fn) -> list:
        out = [None] * self.tp
        threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, fn(i))) for i in range(self.tp)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        return out

    def init_weight_group(self, master_address, master_port, rank_offset, world_size, group_name, backend):
        self.joins.append((rank_offset, world_size, group_name))
        self.groups = self._each_rank(
            lambda i: WeightGroup(
                master_address, master_port, rank_offset + i, world_size, group_name, backend, timeout_s=60
            )
        )

    def update_weights_distributed(self, metas, group_name) -> float:
        per_rank = self._each_rank(
            lambda i: [kv for m in metas for kv in self.groups[i].receive_bucket(BucketMeta(**m))]
        )
        for received in per_rank[1:]:  # every TP rank got the same tensors
            assert all(torch.equal(a, b) for (_, a), (_, b) in zip(per_rank[0], received))
        self.weights = dict(per_rank[0])
        return 0.01

    def load_weights(self, named):
        self.weights.update({n: t.clone() for n, t in named})

    def load_weight_bucket(self, payloads, flush):
        self.buckets.append((list(payloads), flush))
        self.load_weights(_FAKE_IPC[payloads[0]])


def _worker(role: str, rank: int, strategy, name: str = "deepspeed_train", sender: type = WeightSender) -> Worker:
    """A :class:`Worker` around a stand-in strategy (the endpoints under test, without building a backend), with
    the registry entry of strategy ``name`` (what it declares: its abilities), endpoints as ``Worker.__init__``
    builds them (a sender on the training role)."""
    w = Worker.__new__(Worker)
    w.role, w.rank, w.strategy, w.spec = role, rank, strategy, strategy_spec(name)
    w.receiver = WeightReceiver(strategy, w.spec.abilities, f"{role}: strategy {name!r}")
    w.sender = sender(strategy, rank, role) if role == "actor_train" else None
    w.policy_version, w._request_versions = 0, {}
    return w


def _groups(engines, sender: type = WeightSender):
    """The trainer and the sync's two sides (the proxies' weight faces) over local groups; the engines declare
    sglang's abilities."""
    trainer = _Trainer()
    train = LocalWorkerGroup.of("actor_train", [_worker("actor_train", 0, trainer, sender=sender)])
    infer = LocalWorkerGroup.of("actor_infer", [_worker("actor_infer", r, e, "sglang") for r, e in enumerate(engines)])
    return trainer, ActorProxy(train).weights_out, InferProxy(infer).weights_in


def _equal(engine: _Engine, trainer: _Trainer) -> bool:
    return list(engine.weights) == [n for n, _ in trainer.weights] and all(
        torch.equal(engine.weights[n], t) for n, t in trainer.weights
    )


def test_broadcast_sync_two_engines_of_tp2_over_gloo():
    engines = [_Engine(tp=2), _Engine(tp=2)]
    trainer, sender, receiver = _groups(engines)
    sync = WeightSync(sender, receiver, "nccl", bucket_bytes=100, engine_tp_size=2, backend="gloo")
    first = sync()
    assert [e.joins for e in engines] == [[(1, 5, GROUP_NAME)], [(3, 5, GROUP_NAME)]]  # trainer + 2 x TP 2
    assert all(_equal(e, trainer) for e in engines)
    metas = [bucket_meta(b) for b in iter_buckets(trainer.weights, 100)]
    assert sync.metas == [m.to_dict() for m in metas] and len(metas) == 3  # 48 B tensors, two per 100 B bucket
    assert first["sync/mode"] == 1.0 and first["sync/buckets"] == 3.0
    assert first["sync/gib"] == pytest.approx(5 * 48 / 2**30) and first["time/sync"] >= first["time/sync_push"] > 0
    trainer.weights = _weights(shift=1.0)  # the next step's weights: same group, new tensors
    sync()
    assert all(_equal(e, trainer) for e in engines) and all(len(e.joins) == 1 for e in engines)
    sender.group.workers[0].sender.groups[GROUP_NAME].close()


def test_copy_sync_counts_buckets_of_the_engine_push():
    engines = [_Engine(tp=1)]
    trainer, sender, receiver = _groups(engines)
    out = WeightSync(sender, receiver, "copy", bucket_bytes=100, count_buckets=True)()
    assert _equal(engines[0], trainer) and engines[0].joins == []
    assert out["sync/mode"] == 0.0 and out["sync/buckets"] == len(plan_buckets([48] * 5, 100)) == 3


def test_copy_sync_through_shared_memory_removes_its_file(tmp_path):
    engines = [_Engine(tp=1), _Engine(tp=1)]
    trainer, sender, receiver = _groups(engines)
    out = WeightSync(sender, receiver, "copy", bucket_bytes=100, shared_dir=str(tmp_path))()
    assert all(_equal(e, trainer) for e in engines) and list(tmp_path.iterdir()) == []
    assert out["sync/gib"] == pytest.approx(240 / 2**30) and "sync/buckets" not in out


def test_direct_sync_loads_the_trainers_buckets_in_process():
    engines = [_Engine(tp=1), _Engine(tp=1)]
    trainer, sender, receiver = _groups(engines)
    out = WeightSync(sender, receiver, "direct", bucket_bytes=100)()
    assert all(_equal(e, trainer) for e in engines)
    assert out["sync/mode"] == 3.0 and out["sync/buckets"] == 3.0 and out["sync/gib"] == pytest.approx(240 / 2**30)


#: payload -> tensors of the stand-in CUDA IPC share (the real one: tests/strategies/test_ipc_buckets_gpu.py)
_FAKE_IPC: dict[bytes, list] = {}


def _fake_share(bucket):
    """``roll.weights.ipc.share_bucket`` without CUDA: a payload naming the bucket, and a buffer to keep alive."""
    payload = f"bucket-{len(_FAKE_IPC)}".encode()
    _FAKE_IPC[payload] = [(n, t.clone()) for n, t in bucket]
    return payload, torch.zeros(1)


def test_cuda_ipc_sync_routes_each_engine_its_payloads(monkeypatch):
    """The CUDA IPC orchestration on CPU: per bucket of the plan, each engine gets the payload of the trainer rank
    its route names, the last one flushes, and a trainer with more buckets than its plan is an error."""
    monkeypatch.setattr("roll.weights.ipc.share_bucket", _fake_share)
    engines = [_Engine(tp=1), _Engine(tp=1)]
    trainer, sender, receiver = _groups(engines)
    sync = WeightSync(sender, receiver, "cuda_ipc", bucket_bytes=100, ipc_routes=[[0], [0]])
    out = sync()
    assert all(_equal(e, trainer) for e in engines)
    assert [flush for _, flush in engines[0].buckets] == [False, False, True]
    assert engines[0].buckets == engines[1].buckets  # both engines' GPUs hold trainer rank 0
    assert out["sync/mode"] == 2.0 and out["sync/buckets"] == 3.0 and out["sync/gib"] == pytest.approx(240 / 2**30)
    trainer.weights = _weights() + [("extra.weight", torch.zeros(60, dtype=torch.bfloat16))]  # a 4th bucket
    with pytest.raises(RuntimeError, match=r"more weight buckets than its plan \(3\)"):
        sync()


class _FirstLayerOnly(WeightSender):
    """What an adapter-only sync is: a sender whose one ``buckets`` method yields fewer tensors."""

    def buckets(self, bucket_bytes):
        for bucket in super().buckets(bucket_bytes):
            kept = [(name, t) for name, t in bucket if name == "layers.0.weight"]
            if kept:
                yield kept


@pytest.mark.parametrize("mode", ["copy", "shared_memory", "direct", "nccl", "cuda_ipc"])
def test_every_mode_sends_what_the_senders_buckets_yield(mode, tmp_path, monkeypatch):
    """Changing :meth:`WeightSender.buckets` alone changes what every mode sends (plan included): the one place
    an adapter-only sync changes."""
    monkeypatch.setattr("roll.weights.ipc.share_bucket", _fake_share)
    engines = [_Engine(tp=1)]
    trainer, sender, receiver = _groups(engines, sender=_FirstLayerOnly)
    shared = str(tmp_path) if mode == "shared_memory" else None
    name = "copy" if mode == "shared_memory" else mode
    sync = WeightSync(sender, receiver, name, bucket_bytes=100, backend="gloo", shared_dir=shared, count_buckets=True)
    out = sync()
    assert list(engines[0].weights) == ["layers.0.weight"]
    assert torch.equal(engines[0].weights["layers.0.weight"], trainer.weights[0][1])
    assert out["sync/gib"] == pytest.approx(48 / 2**30) and out["sync/buckets"] == 1.0
    if mode == "nccl":
        sender.group.workers[0].sender.groups[GROUP_NAME].close()


def test_worker_refuses_what_its_strategy_cannot_do():
    receiver_only = _worker("actor_infer", 0, object(), "hf_infer")  # declares ipc_weights, not weight_group
    with pytest.raises(TypeError, match="strategy 'hf_infer' cannot receive weights by broadcast .*no 'weight_group'"):
        receiver_only.weights_in(WeightReceiver.receive, [], GROUP_NAME)
    with pytest.raises(TypeError, match="strategy 'hf_infer' cannot join a weight group .*no 'weight_group'"):
        receiver_only.weights_in(WeightReceiver.join_group, "127.0.0.1", 1, 1, 2, GROUP_NAME)
    with pytest.raises(TypeError, match="actor_infer: strategy 'hf_infer' sends no weights"):
        receiver_only.weights_out(WeightSender.gather)
    with pytest.raises(TypeError, match="strategy 'hf_infer' cannot take single requests"):
        receiver_only.submit([], None)
    trainer = _worker("actor_train", 0, _Trainer())
    with pytest.raises(RuntimeError, match="no weight group 'roll_weights'; host it first"):
        trainer.weights_out(WeightSender.broadcast, 100, GROUP_NAME)
    with pytest.raises(TypeError, match="is not a method of WeightSender"):
        trainer.weights_out(WeightReceiver.load, [])  # the entry points run their own endpoint's methods only
    with pytest.raises(TypeError, match="is not a method of WeightReceiver"):
        trainer.weights_in(lambda receiver: receiver.sink)


def test_flattened_bucket_round_trip_mixed_dtypes():
    from roll.weights.ipc import flatten_bucket, share_bucket, unflatten_bucket

    named = [
        ("a", torch.arange(6, dtype=torch.float32).view(2, 3)),
        ("b", torch.tensor(7, dtype=torch.int64)),
        ("c", torch.linspace(-1, 1, 5).to(torch.bfloat16)),
        ("d", torch.ones(3, 1, dtype=torch.float16)),
    ]
    buffer, slots = flatten_bucket(named)
    assert buffer.dtype == torch.uint8 and buffer.numel() == 24 + 8 + 10 + 6
    assert [(s.start_idx, s.end_idx) for s in slots] == [(0, 24), (24, 32), (32, 42), (42, 48)]
    back = unflatten_bucket(buffer, slots)
    assert [n for n, _ in back] == ["a", "b", "c", "d"]
    for (_, want), (_, got) in zip(named, back):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    assert back[0][1].data_ptr() == buffer.data_ptr()  # views, no copy
    with pytest.raises(ValueError, match="CUDA IPC needs GPU tensors"):
        share_bucket(named)


class _FanOutEngine:
    """``submit`` answers the engine's ids as SGLang does for ``n`` samples (``rid#k``); ``poll`` finishes them."""

    def __init__(self):
        self.sent: list[str] = []

    def submit(self, requests, args, max_new_tokens=None):
        self.sent = [f"{rid}#{k}" for rid, _ in requests for k in range(args.num_return_sequences)]
        return self.sent

    def poll(self, rids=None, timeout=None):
        return {rid: GenerationOutput([1], [0.0]) for rid in self.sent}


def test_requests_keep_the_version_they_were_submitted_under_for_every_sample():
    """Samples of one request (``rid#0``, ``rid#1``) carry the version of their submission, not the one current
    when they finish (a sync came in between)."""
    worker = _worker("actor_infer", 0, _FanOutEngine(), "sglang")
    worker.submit([("r", [1, 2])], GeneratingArgs(num_return_sequences=2))
    worker.set_policy_version(3)
    assert {rid: out.policy_version for rid, out in worker.poll().items()} == {"r#0": 0, "r#1": 0}
