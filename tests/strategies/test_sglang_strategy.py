"""``sglang`` strategy on CPU: engine/sampling argument mapping, output parsing, request bookkeeping (submit, poll,
abort) over a fake async engine, and weight sync around memory release. The real engine needs a GPU: that test
skips when SGLang is not importable."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest
import torch

from roll.config.strategies import SGLangOptions, parse_options
from roll.config.worker import GeneratingArgs, WorkerConfig
from roll.strategies.base import GenerationOutput
from roll.strategies.registry import get_strategy_class, strategy_options, strategy_roles
from roll.strategies.sglang import (
    WEIGHT_SYNC_CHOICES,
    RequestTracker,
    SGLangStrategy,
    engine_kwargs,
    engine_tp_size,
    parse_output,
    sampling_params,
)


def test_registered_for_actor_infer_only():
    assert strategy_roles()["sglang"] == frozenset({"actor_infer"})
    assert get_strategy_class("sglang") is SGLangStrategy  # importing the module does not import sglang


def _options(**raw) -> SGLangOptions:
    return parse_options(SGLangOptions, raw, "actor_infer.strategy_args.strategy_config")


def test_engine_kwargs_pass_through_and_roll_keys():
    kw = engine_kwargs(
        "/m",
        "bf16",
        _options(
            mem_fraction_static=0.3,
            tp_size=2,
            weight_bucket_bytes=8,
            release_tags=None,
            attention_backend="flashinfer",
            engine_args={"base_gpu_id": 1},
        ),
        seed=5,
    )
    assert kw["model_path"] == "/m" and kw["skip_tokenizer_init"] is True and kw["random_seed"] == 5
    assert kw["mem_fraction_static"] == 0.3 and kw["tp_size"] == 2 and kw["attention_backend"] == "flashinfer"
    assert kw["dtype"] == "bfloat16" and kw["sampling_backend"] == SGLangOptions().sampling_backend
    assert kw["base_gpu_id"] == 1 and "context_length" not in kw  # typed engine fields left at None are not sent
    assert "weight_bucket_bytes" not in kw and "release_tags" not in kw
    assert engine_kwargs("/m", "fp32", SGLangOptions(), 0)["attention_backend"] == "triton"
    with pytest.raises(ValueError, match=r"\['model_path'\]"):
        _options(engine_args={"model_path": "/other"})
    with pytest.raises(ValueError, match="base_gpu_id.*not a key of SGLangOptions; allowed: weight_sync"):
        _options(base_gpu_id=1)  # other Engine arguments go in engine_args


def test_sampling_params_mapping():
    args = GeneratingArgs(
        max_new_tokens=32,
        temperature=0.7,
        top_p=0.9,
        top_k=20,
        repetition_penalty=1.1,
        stop_token_ids=[7, 3],
        num_return_sequences=4,
    )
    p = sampling_params(args, None, eos_token_id=3)
    assert p == {
        "max_new_tokens": 32,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "repetition_penalty": 1.1,
        "stop_token_ids": [3, 7],
        "ignore_eos": False,
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    forced = sampling_params(GeneratingArgs(ignore_eos=True, stop_token_ids=[7]), 16, 3)
    assert forced["ignore_eos"] is True and forced["stop_token_ids"] == []  # exactly max_new_tokens
    assert sampling_params(args, 5, None)["max_new_tokens"] == 5  # the per-turn budget wins
    greedy = sampling_params(GeneratingArgs(do_sample=False, top_k=0, top_p=0.5), 4, 1)
    assert (greedy["temperature"], greedy["top_k"], greedy["top_p"]) == (0.0, -1, 1.0)
    assert sampling_params(GeneratingArgs(temperature=0.0), 4, 1)["temperature"] == 0.0
    with pytest.raises(ValueError, match="num_beams=2"):
        sampling_params(GeneratingArgs(num_beams=2), 4, 1)


def _result(rid, ids, reason="stop"):
    return {
        "output_ids": ids,
        "meta_info": {
            "id": rid,
            "finish_reason": {"type": reason},
            "output_token_logprobs": [(-0.5 * (i + 1), t, None) for i, t in enumerate(ids)],
        },
    }


def test_parse_output():
    out = parse_output(_result("a", [5, 6, 2]))
    assert out == GenerationOutput([5, 6, 2], [-0.5, -1.0, -1.5], "stop")
    assert parse_output(_result("b", [5], "length")).finish_reason == "length"
    assert parse_output(_result("c", [], "abort")).finish_reason == "abort"
    bad = _result("d", [1, 2])
    bad["meta_info"]["output_token_logprobs"] = []
    with pytest.raises(ValueError, match="return_logprob"):
        parse_output(bad)


class FakeTokenizerManager:
    def __init__(self):
        self.aborted: list[str] = []
        self.unloaded: list[str] = []

    def abort_request(self, rid: str = "", abort_all: bool = False):
        self.aborted.append(rid)

    async def unload_lora_adapter(self, obj, request=None):
        self.unloaded.append(obj.lora_name)


class FakeEngine:
    """Answers request ``rid`` after ``delays[rid]`` seconds with ids = prompt reversed (records what it got)."""

    def __init__(self, delays: dict[str, float] | None = None):
        self.delays = delays or {}
        self.tokenizer_manager = FakeTokenizerManager()
        self.calls: list[tuple[str, list[int], dict]] = []
        self.loop = asyncio.new_event_loop()
        self.pushed: list[list[str]] = []
        self.events: list[str] = []
        self.waiting_after_retract = False
        self.adapter_of: dict[str, str | None] = {}  # request -> the LoRA adapter it was generated with
        self.adapters: dict[str, dict[str, torch.Tensor]] = {}
        self.images_of: dict[str, list | None] = {}  # request -> its image_data
        self.payloads: list[bytes] = []

    def load_lora_adapter_from_tensors(self, lora_name, tensors, config_dict, load_format=None):
        from types import SimpleNamespace

        ok = config_dict.get("r", 0) > 0 and lora_name not in self.adapters
        if ok:
            self.adapters[lora_name] = tensors
        self.events.append(f"adapter:{lora_name}")
        return SimpleNamespace(success=ok, error_message="" if ok else "bad adapter config or name in use")

    async def async_generate(self, input_ids, sampling_params, return_logprob, rid, lora_path=None, image_data=None):
        assert return_logprob
        self.calls.append((rid, input_ids, sampling_params))
        self.images_of[rid] = image_data
        self.adapter_of[rid] = lora_path
        await asyncio.sleep(self.delays.get(rid, 0.0))
        return _result(rid, input_ids[::-1])

    def _flush(self, flush_cache: bool) -> None:
        """SGLang's scheduler after a weight update: a flush with retracted requests waiting fails, and it asserts."""
        if flush_cache and self.waiting_after_retract:
            raise AssertionError("Cache flush failed after updating weights")

    def update_weights_from_tensor(self, named_tensors, flush_cache=True, load_format=None):
        self._flush(flush_cache)
        if load_format == "flattened_bucket":
            self.payloads += named_tensors
            self.events.append(f"ipc({len(named_tensors)}, flush={flush_cache})")
            return (True, "Success")
        self.pushed.append([n for n, _ in named_tensors])
        self.events.append(f"push(flush={flush_cache})")

    def release_memory_occupation(self, tags=None):
        self.events.append("release" if tags is None else f"release{tags}")

    def resume_memory_occupation(self, tags=None):
        self.events.append("resume" if tags is None else f"resume{tags}")

    def update_weights_from_disk(self, model_path):
        self.events.append(f"disk:{model_path}")

    def init_weights_update_group(self, **kwargs):
        self.events.append(("join", kwargs))
        return (kwargs["world_size"] > 1, "world_size must be > 1")

    def update_weights_from_distributed(self, names, dtypes, shapes, group_name, flush_cache):
        self._flush(flush_cache)
        self.events.append(("recv", names, flush_cache))
        return (names != ["bad"], "Failed to update parameter online: shape mismatch")


def test_tracker_poll_returns_each_finished_request_once():
    eng = FakeEngine({"slow": 0.3})
    tr = RequestTracker(eng, eng.loop)
    tr.submit("fast", [1, 2, 3], {"max_new_tokens": 4})
    tr.submit("slow", [4, 5], {"max_new_tokens": 4})
    with pytest.raises(ValueError, match="already in flight"):
        tr.submit("fast", [9], {})
    first = tr.poll(timeout=5)
    assert list(first) == ["fast"] and first["fast"].token_ids == [3, 2, 1]
    assert len(tr) == 1
    assert tr.poll(["fast"], timeout=0.01) == {}  # already handed back
    rest = tr.wait_all(["slow"])
    assert rest["slow"].token_ids == [5, 4] and len(tr) == 0


def test_tracker_poll_only_waits_for_the_asked_requests():
    eng = FakeEngine({"mine": 0.2, "other": 0.0})
    tr = RequestTracker(eng, eng.loop)
    tr.submit("mine", [1], {})
    tr.submit("other", [2], {})
    got = tr.poll(["mine"], timeout=5)
    assert list(got) == ["mine"]
    assert list(tr.poll(["other"], timeout=0)) == ["other"]  # finished meanwhile, kept for its owner


def test_tracker_abort():
    eng = FakeEngine({"a": 10.0, "b": 10.0})
    tr = RequestTracker(eng, eng.loop)
    tr.submit("a", [1], {})
    tr.submit("b", [2], {})
    assert tr.poll(timeout=0.05) == {}
    assert tr.abort(["a", "zzz"]) == ["a"]
    assert eng.tokenizer_manager.aborted == ["a"] and len(tr) == 1
    assert tr.abort() == ["b"] and len(tr) == 0


def _strategy(engine: FakeEngine, bucket_bytes: int = 1 << 30) -> SGLangStrategy:
    s = SGLangStrategy(WorkerConfig(), 0, 1, options=SGLangOptions())
    s.engine, s.tracker, s.eos_token_id, s.rename = engine, RequestTracker(engine, engine.loop), 2, None
    s.bucket_bytes, s.release_tags, s.model_path = bucket_bytes, None, "/init"
    s.skip_names, s.released, s._host_weights, s.last_sync = frozenset({"lm_head.weight"}), False, None, {}
    s._weights_released, s._weights_fresh, s._synced = False, True, False
    s.lora, s.adapter_name, s._adapter_version, s._pending_adapter, s._unloading = None, None, 0, None, []
    return s


def _lora_strategy(engine: FakeEngine) -> SGLangStrategy:
    from roll.config.lora import LoraSettings

    s = _strategy(engine)
    s.lora, s.release_tags = LoraSettings(rank=4, alpha=8.0, dropout=0.0, target="all-linear"), ["kv_cache"]
    return s


def test_adapters_are_served_under_a_new_name_each_sync_and_the_old_one_unloaded(monkeypatch):
    """An adapter sync loads the adapter from memory under a new name; requests from then on use it, requests of
    the old one keep theirs, and the old adapter is unloaded; one that arrives while released waits for the resume.
    A failure of SGLang's load raises with its message."""
    import sys
    import types

    io_struct = types.SimpleNamespace(
        UnloadLoRAAdapterReqInput=lambda lora_name: types.SimpleNamespace(lora_name=lora_name)
    )
    monkeypatch.setitem(sys.modules, "sglang.srt.managers.io_struct", io_struct)
    eng = FakeEngine({"r1": 0.3})
    s = _lora_strategy(eng)
    config = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}
    s.generate([[1, 2]], GeneratingArgs())
    assert list(eng.adapter_of.values()) == [None]  # before the first sync: the base model (B = 0 adapters)
    s.load_adapter([("a.lora_A.weight", torch.ones(4, 2))], config)
    s.submit([("r1", [1, 2])], GeneratingArgs())
    assert s.poll(["r1"], timeout=0.01) == {}  # r1 started, still in flight
    assert eng.adapter_of["r1"] == "roll-policy-1" and eng.tokenizer_manager.unloaded == []
    s.load_adapter([("a.lora_A.weight", torch.full((4, 2), 2.0))], config)  # r1 still in flight
    s.submit([("r2", [3])], GeneratingArgs())
    s.tracker.wait_all(["r1", "r2"])
    assert eng.adapter_of == {next(iter(eng.adapter_of)): None, "r1": "roll-policy-1", "r2": "roll-policy-2"}
    assert eng.tokenizer_manager.unloaded == ["roll-policy-1"]  # once its last request was done
    assert float(eng.adapters["roll-policy-2"]["a.lora_A.weight"][0, 0]) == 2.0
    s.offload_states()
    s.load_adapter([("a.lora_A.weight", torch.full((4, 2), 3.0))], config)
    assert "adapter:roll-policy-3" not in eng.events and s.adapter_name == "roll-policy-2"
    s.reload_states()
    assert eng.events[-3:] == ["release['kv_cache']", "resume['kv_cache']", "adapter:roll-policy-3"]
    assert s.adapter_name == "roll-policy-3" and eng.tokenizer_manager.unloaded[-1] == "roll-policy-2"
    with pytest.raises(RuntimeError, match="load_lora_adapter_from_tensors failed: bad adapter config"):
        s.load_adapter([("a.lora_A.weight", torch.ones(4, 2))], {"r": 0})


def test_an_engine_without_lora_refuses_an_adapter():
    s = _strategy(FakeEngine())
    with pytest.raises(RuntimeError, match="needs an engine started with LoRA"):
        s.load_adapter([], {"r": 4})


def test_lora_engine_args():
    from roll.config.lora import LoraSettings
    from roll.strategies.sglang import lora_engine_args

    args = lora_engine_args(LoraSettings(rank=32, alpha=32.0, dropout=0.0, target="all-linear"))
    assert args == {"enable_lora": True, "max_lora_rank": 32, "lora_target_modules": ["all"], "max_loras_per_batch": 2}
    with pytest.raises(ValueError, match="regular expression"):
        lora_engine_args(LoraSettings(rank=8, alpha=16.0, dropout=0.0, target=".*proj$"))


def test_submit_fans_out_n_and_generate_keeps_prompt_order():
    eng = FakeEngine()
    s = _strategy(eng)
    sent = s.submit([("r1", [1, 2])], GeneratingArgs(num_return_sequences=3), 8)
    assert sent == ["r1#0", "r1#1", "r1#2"]
    assert set(s.tracker.wait_all(sent)) == set(sent)
    assert all(call[2]["max_new_tokens"] == 8 and call[2]["stop_token_ids"] == [2] for call in eng.calls)
    eng.delays = {}
    outs = s.generate([[1, 2], [3, 4, 5], [6]], GeneratingArgs(num_return_sequences=2))
    assert [o.token_ids for o in outs] == [[2, 1], [2, 1], [5, 4, 3], [5, 4, 3], [6], [6]]


def test_weights_bucketed_and_held_while_released():
    eng = FakeEngine()
    s = _strategy(eng, bucket_bytes=32)  # fp32 (2, 2) = 16 bytes: two tensors per bucket
    weights = [(f"w{i}", torch.full((2, 2), float(i))) for i in range(3)] + [("lm_head.weight", torch.ones(2, 2))]
    s.load_weights(weights)
    assert eng.pushed == [["w0", "w1"], ["w2"]]  # lm_head of a tied model is never sent
    assert eng.events == ["push(flush=False)", "push(flush=True)"]
    eng.events.clear()
    s.offload_states()
    s.load_weights([(n, t + 1) for n, t in weights])  # arrives during training: held on the host
    assert eng.events == ["release"]
    s.reload_states()
    assert eng.events == [
        "release",
        "resume['weights', 'kv_cache', 'cuda_graph']",
        "push(flush=False)",
        "push(flush=True)",
    ]
    assert float(s._host_weights[2][1][0, 0]) == 3.0  # the newest weights were pushed
    s.reload_states()  # not released: nothing to do
    assert len(eng.events) == 4


def test_resume_before_any_sync_reloads_initial_weights():
    eng = FakeEngine()
    s = _strategy(eng)
    s.offload_states()
    s.offload_states()  # idempotent
    s.reload_states()
    assert eng.events == ["release", "resume['weights', 'kv_cache', 'cuda_graph']", "disk:/init"]


def test_ipc_buckets_resume_weights_only_then_the_rest():
    eng = FakeEngine()
    s = _strategy(eng)
    s.offload_states()  # training phase: everything released
    s.load_weight_bucket([b"payload-0"], flush=False)  # sync: the weight memory comes back first
    s.load_weight_bucket([b"payload-1"], flush=True)
    s.reload_states()  # rollout: the KV cache and CUDA graphs, no second weight load
    assert eng.events == [
        "release",
        "resume['weights']",
        "ipc(1, flush=False)",
        "ipc(1, flush=True)",
        "resume['kv_cache', 'cuda_graph']",
    ]
    with pytest.raises(ValueError, match="TP size"):
        s.load_weight_bucket([b"a", b"b"], flush=True)
    eng.events.clear()
    s.offload_states()
    with pytest.raises(RuntimeError, match="no weight sync reloaded them"):
        s.reload_states()  # released after an IPC sync, resumed with no new sync: stale weights are refused


def test_weight_group_calls_and_their_failures():
    eng = FakeEngine()
    s = _strategy(eng)
    s.init_weight_group("10.0.0.1", 2345, 1, 3, "roll_weights", "nccl")
    assert eng.events == [
        (
            "join",
            {
                "master_address": "10.0.0.1",
                "master_port": 2345,
                "rank_offset": 1,
                "world_size": 3,
                "group_name": "roll_weights",
                "backend": "nccl",
            },
        )
    ]
    metas = [
        {"names": ["a", "b"], "dtypes": ["bfloat16"] * 2, "shapes": [[2], [3]]},
        {"names": ["c"], "dtypes": ["float32"], "shapes": [[1]]},
    ]
    assert s.update_weights_distributed(metas, "roll_weights") >= 0
    assert eng.events[1:] == [("recv", ["a", "b"], False), ("recv", ["c"], True)]  # only the last flushes
    with pytest.raises(RuntimeError, match="init_weights_update_group failed: world_size must be > 1"):
        s.init_weight_group("10.0.0.1", 2345, 1, 1)
    with pytest.raises(RuntimeError, match="update_weights_from_distributed failed: .*shape mismatch"):
        s.update_weights_distributed([{"names": ["bad"], "dtypes": ["float32"], "shapes": [[1]]}])


def test_a_vision_language_model_gets_one_pad_per_image_and_weights_under_checkpoint_names():
    """SGLang expands each image's pad token itself (from the images it is given) and loads Qwen2.5-VL weights under
    their checkpoint names (``visual.``, ``model.layers``): roll sends the prompt with each run of pads cut to one,
    the images as PIL images, and renames in every sync path (host push, CUDA IPC payloads, NCCL metas)."""
    import numpy as np

    from roll.data.trajectory import ImagePrompt
    from roll.models.vision import checkpoint_name

    eng = FakeEngine()
    s = _strategy(eng)
    s.rename, s.tracker.image_pad_id = checkpoint_name, 9
    frames = [np.full((28, 28, 3), 40, np.uint8), np.full((28, 56, 3), 200, np.uint8)]
    prompt = ImagePrompt([1, 7, 9, 9, 9, 9, 8, 5, 7, 9, 9, 8, 3], frames)
    s.generate([prompt, [4, 5]], GeneratingArgs())
    (rid, ids, _), (_, plain, _) = eng.calls
    assert ids == [1, 7, 9, 8, 5, 7, 9, 8, 3] and plain == [4, 5]
    sent = eng.images_of[rid]
    assert [im.size for im in sent] == [(28, 28), (56, 28)] and np.asarray(sent[1])[0, 0, 0] == 200
    s.load_weights(
        [("model.language_model.layers.0.mlp.up_proj.weight", torch.ones(1)), ("model.visual.x", torch.ones(1))]
    )
    assert eng.pushed == [["model.layers.0.mlp.up_proj.weight", "visual.x"]]
    s.update_weights_distributed([{"names": ["model.visual.y"], "dtypes": ["float32"], "shapes": [[1]]}])
    assert eng.events[-1] == ("recv", ["visual.y"], True)
    with pytest.raises(ValueError, match="without image tokens"):
        RequestTracker(eng, eng.loop).submit("r", ImagePrompt([9], frames[:1]), {})


def test_rename_payload_renames_the_slots_and_keeps_the_cuda_handle_unopened():
    """A CUDA IPC payload's names are rewritten without opening its handle (no GPU here: opening would fail)."""
    import io
    import types
    from multiprocessing.reduction import ForkingPickler

    from torch.multiprocessing import reductions

    from roll.weights.ipc import payload_globals, rename_payload

    class Handle:
        def __reduce__(self):
            return reductions.rebuild_cuda_tensor, ("GPU-uuid", 7)

    meta = [types.SimpleNamespace(name="model.visual.a", start_idx=0), types.SimpleNamespace(name="lm", start_idx=4)]
    out = io.BytesIO()
    ForkingPickler(out).dump({"flattened_tensor": Handle(), "metadata": meta})
    renamed = rename_payload(out.getvalue(), lambda n: n.replace("model.visual.", "visual."))
    assert "torch.multiprocessing.reductions.rebuild_cuda_tensor" in payload_globals(renamed)

    class Peek(__import__("pickle").Unpickler):
        def find_class(self, module, name):
            if name == "rebuild_cuda_tensor":
                return lambda *args: ("handle", args)
            return super().find_class(module, name)

    data = Peek(io.BytesIO(renamed)).load()
    assert data["flattened_tensor"] == ("handle", ("GPU-uuid", 7))
    assert [m.name for m in data["metadata"]] == ["visual.a", "lm"] and data["metadata"][1].start_idx == 4
    s = _strategy(FakeEngine())
    s.rename = lambda n: n.replace("model.visual.", "visual.")
    s.load_weight_bucket([out.getvalue()], flush=True)
    assert [m.name for m in Peek(io.BytesIO(s.engine.payloads[0])).load()["metadata"]] == ["visual.a", "lm"]


def test_engine_tp_size_and_weight_sync_key():
    cfg = WorkerConfig()
    cfg.num_gpus_per_worker = 2
    assert engine_tp_size(cfg, SGLangOptions()) == 2 == SGLangStrategy.weight_group_ranks(cfg, SGLangOptions())
    options = _options(tp_size=1, weight_sync="copy")
    assert engine_tp_size(cfg, options) == 1
    assert "weight_sync" not in engine_kwargs("/m", "bf16", options, 0)
    assert WEIGHT_SYNC_CHOICES == ("auto", "nccl", "cuda_ipc", "copy")


@pytest.mark.skipif(
    importlib.util.find_spec("sglang") is None,
    reason="SGLang is not importable here (GPU-only; never installed in the CPU venv): the real "
    "engine is checked by scripts/verify_gpu_sglang.sh on the GPU machine",
)
def test_real_engine_generates(tiny_model_dir):
    if not torch.cuda.is_available():
        pytest.skip("SGLang is installed but no GPU is visible")
    from roll.strategies.base import StrategyContext

    cfg = WorkerConfig()
    cfg.model_args.model_name_or_path = tiny_model_dir
    cfg.strategy_args.strategy_name, cfg.strategy_args.strategy_config = "sglang", {"mem_fraction_static": 0.2}
    s = SGLangStrategy(cfg, 0, 1, options=strategy_options(cfg))
    s.initialize(StrategyContext(seed=0))
    try:
        outs = s.generate([[1, 2, 3]] * 4, GeneratingArgs(max_new_tokens=8))
        assert len(outs) == 4 and all(len(o.token_ids) == len(o.log_probs) > 0 for o in outs)
    finally:
        s.shutdown()


def test_weight_push_with_requests_in_flight_pauses_by_retract_never_abort(monkeypatch):
    """Partial rollouts: a push while requests run is bracketed by pause_generation(mode="retract") and
    continue_generation; the requests are neither aborted nor lost and finish after the push. SGLang's io_struct is
    replaced by a stand-in with the same two request types (SGLang itself needs a GPU)."""
    import dataclasses
    import sys
    import types

    @dataclasses.dataclass
    class PauseGenerationReqInput:
        mode: str = "abort"

    @dataclasses.dataclass
    class ContinueGenerationReqInput:
        pass

    io_struct = types.ModuleType("sglang.srt.managers.io_struct")
    io_struct.PauseGenerationReqInput, io_struct.ContinueGenerationReqInput = (
        PauseGenerationReqInput,
        ContinueGenerationReqInput,
    )
    for name in ("sglang", "sglang.srt", "sglang.srt.managers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.managers.io_struct", io_struct)
    eng = FakeEngine({"r1": 0.05})

    async def pause_generation(obj):
        eng.events.append(f"pause({obj.mode})")
        eng.waiting_after_retract = True  # r1 is back in the waiting queue

    async def continue_generation(obj):
        eng.events.append("continue")
        eng.waiting_after_retract = False

    eng.tokenizer_manager.pause_generation = pause_generation
    eng.tokenizer_manager.continue_generation = continue_generation
    s = _strategy(eng, bucket_bytes=1 << 20)
    s.load_weights([("w0", torch.ones(2, 2))])  # nothing in flight: no pause
    s.submit([("r1", [1, 2, 3])], GeneratingArgs(), 4)
    s.load_weights([("w0", torch.ones(2, 2))])
    s.update_weights_distributed([{"names": ["w0"], "dtypes": ["float32"], "shapes": [[2, 2]]}])
    s.load_weight_bucket([b"payload"], flush=True)
    # SGLang cannot flush while r1 waits: no update in flight asks it to (the engine runs without a radix cache)
    assert eng.events == [
        "push(flush=True)",
        "pause(retract)",
        "push(flush=False)",
        "continue",
        "pause(retract)",
        ("recv", ["w0"], False),
        "continue",
        "pause(retract)",
        "ipc(1, flush=False)",
        "continue",
    ]
    assert eng.tokenizer_manager.aborted == []
    assert s.tracker.wait_all(["r1"])["r1"].token_ids == [3, 2, 1]


def test_async_run_starts_the_engine_without_radix_cache(monkeypatch, tiny_model_dir):
    """An update with requests in flight cannot flush SGLang's cache, so an asynchronous run starts the engine
    with ``disable_radix_cache`` (no prefix KV of older weights is reused); a synchronous run keeps the cache, and
    ``engine_args`` decides where it names the key. ``sglang.Engine`` is a recording stand-in (SGLang needs a GPU)."""
    import sys
    import types

    from roll.strategies.base import StrategyContext

    started: list[dict] = []

    class Engine:
        def __init__(self, **kwargs):
            started.append(kwargs)
            self.loop = asyncio.new_event_loop()

    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(Engine=Engine))
    for async_rollouts, engine_args, expected in [
        (False, {}, None),
        (True, {}, True),
        (True, {"disable_radix_cache": False}, False),
    ]:
        cfg = WorkerConfig()
        cfg.model_args.model_name_or_path = tiny_model_dir
        cfg.strategy_args.strategy_name, cfg.strategy_args.strategy_config = "sglang", {"engine_args": engine_args}
        SGLangStrategy(cfg, 0, 1, options=strategy_options(cfg)).initialize(
            StrategyContext(seed=0, async_rollouts=async_rollouts)
        )
        assert started[-1].get("disable_radix_cache") == expected, (async_rollouts, engine_args)
