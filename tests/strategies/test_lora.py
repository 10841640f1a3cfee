"""LoRA (peft) on the training strategies, on CPU with the tiny model: ``deepspeed_train`` ZeRO 0, 2 and 3 and
``fsdp2_train`` each train three steps on a fixed batch, then:

- only the adapters train: the base weights are bit for bit the pretrained ones, the adapters moved, the optimizer
  holds state for the adapters only, the loss went down;
- the reference (the adapters off) is the base model: its log-probs equal a plain transformers model's, after
  training too, while the actor's differ;
- the full-weight export (``named_weights``, the buckets) is the plain model with peft's merge, under its plain
  names; a plain model with those weights scores like the actor;
- checkpoints hold the adapter and its optimizer state, not the base, and resume exactly;
- ``hf_infer`` serves the trainer's adapter (``adapter_weights`` / ``load_adapter``) with the trainer's log-probs;
- ``save_pretrained`` writes a peft adapter directory that ``roll merge-lora`` turns into a plain model.

A broken implementation fails here: adapters that never receive gradients leave the loss flat and ``lora_B`` at
zero; a trainable base moves the base weights; an export without the merge scores like the base model, not the
actor; a checkpoint that omits the optimizer state or the adapter resumes to another step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from roll.config.worker import WorkerConfig
from roll.models.logprobs import token_log_probs
from roll.models.lora import PEFT_PREFIX, adapter_names
from roll.ppo.loss_fns import SFT_LOSS
from roll.strategies.base import StrategyContext
from roll.strategies.registry import build_strategy
from tests.strategies.test_train_step import _batch

BACKENDS = {
    "zero0": ("deepspeed_train", {"zero_stage": 0}),
    "zero2": ("deepspeed_train", {"zero_stage": 2}),
    "zero3": ("deepspeed_train", {"zero_stage": 3}),
    "fsdp2": ("fsdp2_train", {}),
}
STEPS = 3


pytestmark = pytest.mark.usefixtures("dist_env")  # one-rank torch.distributed environment (conftest)


def build(model_dir: str, backend: str, *, checkpointing: bool = False, target="all-linear", role="actor_train"):
    """A strategy of ``backend`` (a key of :data:`BACKENDS`, or ``hf_infer``) with rank-4 LoRA adapters."""
    name, options = BACKENDS.get(backend, (backend, {}))
    cfg = WorkerConfig()
    cfg.model_args.model_name_or_path = model_dir
    cfg.model_args.disable_gradient_checkpointing = not checkpointing
    if target is not None:
        cfg.model_args.lora_target, cfg.model_args.lora_rank, cfg.model_args.lora_alpha = target, 4, 8
    cfg.strategy_args.strategy_name, cfg.strategy_args.strategy_config = name, dict(options)
    cfg.training_args.per_device_train_batch_size = 2
    cfg.training_args.gradient_accumulation_steps = 4
    cfg.training_args.learning_rate = 1e-2
    strategy = build_strategy(cfg, role)
    strategy.initialize(StrategyContext(seed=0, max_grad_norm=1.0, total_steps=10))
    return strategy


def _model(strategy) -> torch.nn.Module:
    """The peft model of a training strategy (DeepSpeed wraps it in its engine)."""
    return strategy.engine.module if hasattr(strategy, "engine") else strategy.model


def _gathered(strategy) -> dict[str, torch.Tensor]:
    """Every parameter of the peft model, whole, by its peft name (CPU copies)."""
    if hasattr(strategy, "engine"):
        with strategy._gathered():
            return {n: p.detach().clone() for n, p in strategy.engine.module.named_parameters()}
    from roll.strategies.fsdp2_shard import full_tensor

    return {n: full_tensor(p, torch.device("cpu")).clone() for n, p in strategy._params().items()}


def _plain(model_dir: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir)


@torch.no_grad()
def _log_probs(model: torch.nn.Module, batch) -> torch.Tensor:
    return token_log_probs(model, batch["input_ids"], batch["attention_mask"])[0]


@pytest.fixture(scope="module", params=list(BACKENDS))
def trained(request, tiny_model_dir):
    """``(backend, strategy, record)``: the strategy after :data:`STEPS` SFT steps on one batch; ``record`` holds
    the losses, the parameters before training and the base model's log-probs before training."""
    strategy = build(tiny_model_dir, request.param)
    batch = _batch()
    record = {"before": _gathered(strategy), "base_before": strategy.compute_base_log_probs(batch)["log_probs"]}
    record["losses"] = [strategy.train_step(batch, SFT_LOSS)["sft/loss"] for _ in range(STEPS)]
    return request.param, strategy, record


def test_only_the_adapters_train(trained, tiny_model_dir):
    backend, strategy, record = trained
    losses, before, after = record["losses"], record["before"], _gathered(strategy)
    assert losses[-1] < losses[0] - 0.1, losses  # the fixed batch's loss goes down
    adapters = set(adapter_names(_model(strategy)))
    assert adapters and all(".lora_A." in n or ".lora_B." in n for n in adapters)
    plain = dict(_plain(tiny_model_dir).named_parameters())
    for name, tensor in after.items():
        if name in adapters:
            assert not torch.equal(tensor, before[name]), f"{backend}: adapter {name} did not move"
        else:  # the base: bit for bit the pretrained weights
            assert torch.equal(tensor, before[name]), f"{backend}: base weight {name} moved"
            plain_name = name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")
            assert torch.equal(tensor, plain[plain_name].detach()), name
    assert all(bool(after[n].abs().sum() > 0) for n in adapters if ".lora_B." in n)  # B starts at zero


def test_optimizer_state_is_the_adapters_only(trained):
    backend, strategy, _ = trained
    model = _model(strategy)
    params, adapters = dict(model.named_parameters()), set(adapter_names(model))
    numels = {n: getattr(p, "ds_numel", p.numel()) for n, p in params.items()}  # ZeRO-3: the whole tensor's
    adapter_numel = sum(v for n, v in numels.items() if n in adapters)
    base_numel = sum(v for n, v in numels.items() if n not in adapters)
    optimizer = strategy.torch_optimizer if hasattr(strategy, "torch_optimizer") else strategy.optimizer
    state = optimizer.state
    if backend in ("zero0", "fsdp2"):  # the optimizer's own parameters: exactly the adapters
        ids = {id(params[n]) for n in adapters}
        assert {id(p) for group in optimizer.param_groups for p in group["params"]} == ids
        assert {id(p) for p in state} == ids
    numel = sum(
        s["exp_avg"].numel() if not hasattr(s["exp_avg"], "full_tensor") else s["exp_avg"].full_tensor().numel()
        for s in state.values()
    )
    # ZeRO 1-3 keep one flat fp32 partition of the trainable parameters (padded for alignment)
    assert adapter_numel <= numel < adapter_numel + 64 < base_numel, (backend, numel, adapter_numel, base_numel)


def test_reference_is_the_base_model(trained, tiny_model_dir):
    """Adapters off: the plain model's log-probs before and after training; the actor's differ after it."""
    _, strategy, record = trained
    batch = _batch()
    want = _log_probs(_plain(tiny_model_dir), batch)
    torch.testing.assert_close(record["base_before"], want, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(strategy.compute_base_log_probs(batch)["log_probs"], want, atol=1e-6, rtol=1e-6)
    actor = strategy.compute_log_probs(batch)["log_probs"]
    assert float((actor - want).abs().max()) > 0.1  # the trained adapters change the policy


def test_full_weight_export_is_the_merged_model(trained, tiny_model_dir):
    """named_weights and the buckets: the plain model's names, peft's merge_and_unload of the trained adapter
    (bit for bit in fp32); a plain model loaded with them scores like the actor."""
    from peft import get_peft_model, set_peft_model_state_dict

    from roll.config.lora import lora_settings
    from roll.models.lora import lora_config

    _, strategy, _ = trained
    exported = dict(strategy.named_weights())
    plain = _plain(tiny_model_dir)
    assert list(exported) == [n for n, _ in plain.named_parameters()]
    peft_model = get_peft_model(_plain(tiny_model_dir), lora_config(lora_settings(strategy.config.model_args)))
    set_peft_model_state_dict(peft_model, dict(strategy.adapter_weights()))
    want = dict(peft_model.merge_and_unload().named_parameters())
    for name, tensor in exported.items():
        assert torch.equal(tensor, want[name].detach()), name
    moved = [n for n, t in exported.items() if not torch.equal(t, plain.get_parameter(n))]
    assert len(moved) == 14  # q, k, v, o, gate, up, down of both layers
    buckets = list(strategy.weight_buckets(20_000))
    metas = strategy.weight_bucket_metas(20_000)
    assert [n for m in metas for n in m.names] == list(exported)
    for bucket in buckets:
        for name, tensor in bucket:
            assert torch.equal(tensor.cpu(), exported[name]), name
    plain.load_state_dict(exported, strict=False)
    batch = _batch(seed=3)
    torch.testing.assert_close(
        _log_probs(plain, batch), strategy.compute_log_probs(batch)["log_probs"], atol=1e-5, rtol=1e-5
    )


def test_hf_infer_serves_the_trainers_adapter(trained, tiny_model_dir):
    """The sending side (``adapter_weights``: peft's names, gathered) into the receiving side (``hf_infer.
    load_adapter``): the engine's log-probs of a fixed reply equal the trainer's; it still generates."""
    from roll.config.worker import GeneratingArgs

    _, strategy, _ = trained
    engine = build(tiny_model_dir, "hf_infer", target=None, role="actor_infer")
    batch = _batch(seed=4)
    base = engine.compute_log_probs(batch)["log_probs"]
    named = strategy.adapter_weights()
    assert named and all(".lora_A.weight" in n or ".lora_B.weight" in n for n, _ in named)
    engine.load_adapter(named, strategy.adapter_config())
    got = engine.compute_log_probs(batch)["log_probs"]
    torch.testing.assert_close(got, strategy.compute_log_probs(batch)["log_probs"], atol=1e-6, rtol=1e-6)
    assert float((got - base).abs().max()) > 0.1
    out = engine.generate([[5, 6, 7], [8, 9]], GeneratingArgs(max_new_tokens=3, do_sample=False))
    assert [len(o.token_ids) for o in out] == [3, 3]
    engine.load_adapter(named, strategy.adapter_config())  # a second sync replaces the tensors in place
    torch.testing.assert_close(engine.compute_log_probs(batch)["log_probs"], got, atol=0, rtol=0)
    with pytest.raises(KeyError, match="does not fit"):
        engine.load_adapter(named[:-1], strategy.adapter_config())
    with pytest.raises(RuntimeError, match="serves a LoRA adapter"):  # merged weights on top would count it twice
        engine.load_weights(strategy.named_weights())


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_checkpoint_holds_the_adapter_and_resumes_exactly(tiny_model_dir, tmp_path, backend):
    """step, save, step == load, step (metrics and adapters bit for bit); the checkpoint's model state is the
    adapter's tensors only."""
    first, second = _batch(seed=1), _batch(seed=2)
    a = build(tiny_model_dir, backend)
    a.train_step(first, SFT_LOSS)
    a.save_checkpoint(str(tmp_path / "ckpt"))
    straight = a.train_step(second, SFT_LOSS)
    b = build(tiny_model_dir, backend)
    b.load_checkpoint(str(tmp_path / "ckpt"))
    assert b.optimizer_steps == 1
    assert b.train_step(second, SFT_LOSS) == straight
    wa, wb = dict(a.adapter_weights()), dict(b.adapter_weights())
    assert set(wa) == set(wb) and all(torch.equal(wa[n], wb[n]) for n in wa)
    adapters = {n for n in adapter_names(_model(a))}
    assert sorted(_checkpoint_model_keys(tmp_path / "ckpt", backend)) == sorted(adapters)


def _checkpoint_model_keys(path, backend: str) -> list[str]:
    """The model tensors a checkpoint holds (DeepSpeed: the module state, and no fragments of frozen parameters;
    ZeRO-3's module entries are placeholders of the partitions saved with the optimizer; FSDP2: DCP's ``model.*``
    entries)."""
    if backend == "fsdp2":
        import torch.distributed.checkpoint as dcp

        keys = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
        return [k.removeprefix("model.") for k in keys if k.startswith("model.")]
    files = sorted((path / "engine").glob("*model_states.pt"))
    assert len(files) == 1, files
    state = torch.load(files[0], weights_only=False)
    assert state["frozen_param_fragments"] is None and state["frozen_param_shapes"] is None
    return list(state["module"])


def test_gradient_checkpointing_reaches_the_adapters(tiny_model_dir):
    """With activation checkpointing (frozen embeddings feed the checkpointed layers) the adapters get the same
    gradients as without it (Adam's first moment after one step)."""
    batch = _batch()
    grads = []
    for backend, checkpointing in (("zero0", False), ("zero0", True), ("fsdp2", True)):
        s = build(tiny_model_dir, backend, checkpointing=checkpointing)
        s.train_step(batch, SFT_LOSS)
        optimizer = s.torch_optimizer if hasattr(s, "torch_optimizer") else s.optimizer
        named = dict(_model(s).named_parameters())
        moment = {}
        for n in adapter_names(_model(s)):
            m = optimizer.state[named[n]]["exp_avg"]
            moment[n] = m.full_tensor() if hasattr(m, "full_tensor") else m
        grads.append(moment)
    assert any(bool(g.abs().sum() > 0) for g in grads[0].values())
    for got in grads[1:]:
        for name, want in grads[0].items():
            torch.testing.assert_close(got[name], want, atol=1e-7, rtol=1e-5, msg=name)


def test_save_pretrained_and_merge_lora(tiny_model_dir, tmp_path):
    """``save_pretrained`` writes a peft adapter directory (no base weights); ``roll merge-lora`` makes a plain
    model whose logits equal the peft model's and which loads with ``AutoModelForCausalLM`` where peft cannot
    be imported."""
    from peft import PeftModel

    from roll.launch.cli import main

    relative = os.path.relpath(tiny_model_dir)  # as a config's ./output/models/... (the run's directory)
    s = build(relative, "fsdp2", target="q_proj,v_proj")
    for _ in range(2):
        s.train_step(_batch(), SFT_LOSS)
    adapter, merged = tmp_path / "final", tmp_path / "merged"
    s.save_pretrained(str(adapter))
    files = {p.name for p in adapter.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer_config.json"} <= files
    assert not any(f.startswith("model") for f in files)
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(os.path.realpath(tiny_model_dir))
    assert config["r"] == 4 and config["lora_alpha"] == 8 and sorted(config["target_modules"]) == ["q_proj", "v_proj"]
    assert main(["merge-lora", str(adapter), "--out", str(merged)]) == 0
    assert not (merged / "adapter_config.json").exists()
    batch = _batch(seed=6)
    peft_model = PeftModel.from_pretrained(_plain(tiny_model_dir), str(adapter)).eval()
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        want = peft_model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(
        _log_probs(peft_model, batch), s.compute_log_probs(batch)["log_probs"], atol=1e-5, rtol=1e-5
    )
    script = (
        "import sys, torch; sys.modules['peft'] = None\n"  # any import of peft now fails
        "from transformers import AutoModelForCausalLM\n"
        f"m = AutoModelForCausalLM.from_pretrained({str(merged)!r}).eval()\n"
        f"b = torch.load({str(tmp_path / 'batch.pt')!r})\n"
        "with torch.no_grad(): torch.save(m(input_ids=b[0], attention_mask=b[1]).logits, sys.argv[1])\n"
    )
    torch.save((ids, mask), tmp_path / "batch.pt")
    run = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "logits.pt")], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = torch.load(tmp_path / "logits.pt")
    assert float((want - _plain(tiny_model_dir)(input_ids=ids, attention_mask=mask).logits).abs().max()) > 1e-3
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_merge_lora_errors_are_one_line(tmp_path, capsys):
    from roll.launch.cli import main

    assert main(["merge-lora", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "not a peft adapter directory" in capsys.readouterr().err


@pytest.mark.slow
def test_two_fsdp2_ranks_gather_the_adapter(tiny_model_dir, tmp_path):
    """fsdp2_train over two gloo ranks (``fsdp2_peer.py lora``): the adapters get the gradients of one rank on the
    whole batch; rank 0's ``adapter_weights`` and merged export are the whole tensors (peft's merge of that
    adapter), every rank's buckets hold them, the base log-probs are the plain model's on both ranks, and a
    checkpoint resumes exactly."""
    from peft import get_peft_model, set_peft_model_state_dict

    from roll.algorithms.losses import ActorLossConfig
    from roll.config.lora import lora_settings
    from roll.models.lora import lora_config
    from roll.ppo.loss_fns import PPOActorLoss
    from tests.strategies.fsdp2_peer import ORDER, applied_grads
    from tests.strategies.fsdp2_peer import strategy as peer_strategy
    from tests.strategies.test_fsdp2 import run_peers

    load = run_peers(2, "lora", tiny_model_dir, tmp_path)
    one = peer_strategy(tiny_model_dir, per_device=2, accum=4, dynamic=True, lora=True)
    one.train_step(_batch().select(ORDER), PPOActorLoss(ActorLossConfig(loss_agg_mode="token-mean")))
    want_grads = applied_grads(one)
    assert want_grads and all(".lora_" in n for n in want_grads)
    ranks = [load("lora", r) for r in range(2)]
    adapter, named = ranks[0]["adapter"], ranks[0]["named"]
    assert ranks[1]["adapter"] == {} and ranks[1]["named"] == {}  # rank 0 answers
    peft_model = get_peft_model(_plain(tiny_model_dir), lora_config(lora_settings(one.config.model_args)))
    set_peft_model_state_dict(peft_model, adapter)
    merged = dict(peft_model.merge_and_unload().named_parameters())
    assert list(named) == list(merged)
    plain = _log_probs(_plain(tiny_model_dir), _batch())
    for rank, result in enumerate(ranks):
        assert set(result["grads"]) == set(want_grads)
        for name, grad in want_grads.items():
            torch.testing.assert_close(result["grads"][name], grad, atol=1e-6, rtol=1e-4, msg=name)
        for bucket in result["buckets"]:
            for name, tensor in bucket:
                assert torch.equal(tensor, merged[name].detach()), (rank, name)
        torch.testing.assert_close(result["base_log_probs"], plain, atol=1e-6, rtol=1e-6)
        straight, resumed = result["steps"]
        assert resumed == straight, rank
    for name, tensor in named.items():
        assert torch.equal(tensor, merged[name].detach()), name
    a, b = ranks[0]["adapters"]
    assert set(a) == set(b) == set(adapter) and all(torch.equal(a[n], b[n]) for n in a)
