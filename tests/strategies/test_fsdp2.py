"""``fsdp2_train`` / ``fsdp2_infer`` on CPU (gloo): the training step of ``deepspeed_train`` (bit for bit in fp32 at
world size 1, to float tolerance over two ranks), mixed precision, activation checkpointing, CPU offload, exact
resume, HF export, weight buckets, the critic and the reference model; then the options' validation and the vLLM
message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from roll.algorithms.losses import ActorLossConfig
from roll.config.worker import WorkerConfig
from roll.models.logprobs import token_log_probs
from roll.ppo.loss_fns import SFT_LOSS, CriticValueLoss, PPOActorLoss
from roll.strategies.base import StrategyContext
from roll.strategies.registry import build_strategy
from tests.strategies.test_train_step import _applied_grads, _batch

HERE = Path(__file__).resolve().parent
PPO = PPOActorLoss(ActorLossConfig(loss_agg_mode="token-mean"))


pytestmark = pytest.mark.usefixtures("dist_env")  # one-rank torch.distributed environment (conftest)


def _build(
    model_dir: str,
    name: str,
    options: dict,
    *,
    role: str = "actor_train",
    dynamic: bool = False,
    pack: bool = False,
    checkpointing: bool = False,
    dtype: str = "fp32",
    per_device: int = 2,
    accum: int = 4,
):
    """Strategy ``name`` for ``role`` at world size 1 with the settings of ``test_train_step._strategy``."""
    cfg = WorkerConfig()
    cfg.model_args.model_name_or_path = model_dir
    cfg.model_args.dtype = dtype
    cfg.model_args.disable_gradient_checkpointing = not checkpointing
    cfg.strategy_args.strategy_name = name
    cfg.strategy_args.strategy_config = options
    cfg.training_args.per_device_train_batch_size = per_device
    cfg.training_args.gradient_accumulation_steps = accum
    cfg.training_args.learning_rate = 1e-2
    cfg.use_dynamic_batching_in_train = cfg.use_dynamic_batching_in_infer = dynamic
    cfg.max_tokens_per_microbatch_in_train = cfg.max_tokens_per_microbatch_in_infer = 20
    cfg.use_sequence_packing = pack
    strategy = build_strategy(cfg, role)
    strategy.initialize(StrategyContext(seed=0, max_grad_norm=0.5, total_steps=10))
    return strategy


def _fsdp2(model_dir: str, options: dict | None = None, *, name: str = "fsdp2_train", **kwargs):
    """fsdp2_train (or fsdp2_infer) with ``options`` as its strategy_config (``kwargs``: see :func:`_build`)."""
    return _build(model_dir, name, dict(options or {}), **kwargs)


def _deepspeed(model_dir: str, stage: int = 0, **kwargs):
    """deepspeed_train with the same settings, ZeRO ``stage``."""
    return _build(model_dir, "deepspeed_train", {"zero_stage": stage}, **kwargs)


def _fsdp2_grads(strategy) -> dict[str, torch.Tensor]:
    """The applied (clipped) gradients of the first step, from Adam's first moment (see ``_applied_grads``)."""
    beta1 = strategy.config.training_args.adam_beta1
    state = strategy.optimizer.state
    return {n: state[p]["exp_avg"].full_tensor() / (1 - beta1) for n, p in strategy.model.named_parameters()}


def _assert_close(got: dict, want: dict, atol: float = 1e-6, rtol: float = 1e-4) -> None:
    """Equal tensors by name; ``want`` must not be all zeros (two zero gradients would be "equal")."""
    assert set(got) == set(want)
    assert not want or any(bool(t.abs().sum() > 0) for t in want.values()), "nothing to compare: all zeros"
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=atol, rtol=rtol, msg=name)


# ---------------------------------------------------------------- the training step against deepspeed_train
@pytest.mark.parametrize(
    "dynamic, pack, checkpointing", [(False, False, False), (True, True, False), (True, False, True)]
)
def test_train_step_equals_deepspeed(tiny_model_dir, dynamic, pack, checkpointing):
    """Same batch, same micro-batching: the loss, the pre-clip gradient norm and the applied gradients of
    fsdp2_train equal deepspeed_train's (ZeRO-0, fp32), with and without activation checkpointing."""
    batch = _batch()
    ds = _deepspeed(tiny_model_dir, dynamic=dynamic, pack=pack)
    want = ds.train_step(batch, PPO)
    fs = _fsdp2(tiny_model_dir, dynamic=dynamic, pack=pack, checkpointing=checkpointing)
    got = fs.train_step(batch, PPO)
    assert got["actor/grad_norm"] > 0.5  # the clip (0.5) is active: a post-clip norm would read 0.5
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-7), key
    _assert_close(_fsdp2_grads(fs), _applied_grads(ds))
    assert all(p.dtype == torch.float32 for p in fs.model.parameters())


def test_bf16_mixed_precision(tiny_model_dir):
    """param_dtype bf16: fp32 master shards, forward in bf16 (log-probs equal a bf16 copy of the model's), the
    step close to DeepSpeed's bf16 ZeRO-2 (both keep fp32 master weights), weights exported in bf16."""
    from transformers import AutoModelForCausalLM

    batch = _batch()
    fs = _fsdp2(tiny_model_dir, {"param_dtype": "bf16"}, dtype="bf16")
    assert all(p.dtype == torch.float32 for p in fs.model.parameters())
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    want_lp, _ = token_log_probs(plain, batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(fs.compute_log_probs(batch)["log_probs"], want_lp, atol=0, rtol=0)
    got = fs.train_step(batch, SFT_LOSS)
    ds = _deepspeed(tiny_model_dir, stage=2, dtype="bf16")
    want = ds.train_step(batch, SFT_LOSS)
    assert got["sft/loss"] == pytest.approx(want["sft/loss"], rel=1e-6)  # same bf16 forward before the step
    assert want["actor/grad_norm"] > 0  # two zero norms would be "equal"
    assert got["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=2e-2)
    assert {t.dtype for _, t in fs.named_weights()} == {torch.bfloat16}


def test_cpu_offload_policy_gives_the_same_step(tiny_model_dir):
    batch = _batch()
    plain = _fsdp2(tiny_model_dir)
    offloaded = _fsdp2(tiny_model_dir, {"offload_policy": True})
    assert plain.train_step(batch, SFT_LOSS) == offloaded.train_step(batch, SFT_LOSS)
    _assert_close(_fsdp2_grads(offloaded), _fsdp2_grads(plain), atol=0, rtol=0)


def test_untied_head_sharded_as_its_own_unit(tmp_path, monkeypatch):
    """wrap_embeddings / wrap_lm_output: the head's weight is a DTensor shard when the log-prob pass applies it,
    so the pass goes through the module (checkpointed), not the fused kernel; the step is the same as with the
    head in the root unit (whose weight is whole during the pass: the fused kernel)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from roll.models.logprobs import LinearLogProbs

    fused_calls = []
    original = LinearLogProbs.apply
    monkeypatch.setattr(LinearLogProbs, "apply", lambda *args: fused_calls.append(1) or original(*args))
    config = Qwen2Config(
        vocab_size=512,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "untied")
    batch = _batch()
    root = _fsdp2(str(tmp_path / "untied"))
    units = _fsdp2(str(tmp_path / "untied"), {"wrap_policy": {"wrap_embeddings": True, "wrap_lm_output": True}})
    want = root.train_step(batch, PPO)
    assert len(fused_calls) == 4  # one chunk per micro-batch
    assert units.train_step(batch, PPO) == pytest.approx(want, rel=1e-6)
    assert len(fused_calls) == 4
    _assert_close(_fsdp2_grads(units), _fsdp2_grads(root), atol=1e-7, rtol=1e-5)


def test_wrap_policy_errors(tiny_model_dir):
    with pytest.raises(ValueError, match="ties its LM head"):
        _fsdp2(tiny_model_dir, {"wrap_policy": {"wrap_lm_output": True}})
    with pytest.raises(ValueError, match=r"matches no module of Qwen2ForCausalLM; its module classes: .*Qwen2MLP"):
        _fsdp2(tiny_model_dir, {"wrap_policy": {"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}})


# ---------------------------------------------------------------- checkpoints, export, weights
@pytest.mark.parametrize("reset", [False, True])
def test_exact_resume(tiny_model_dir, tmp_path, reset):
    """step, save, step == load, step: metrics and weights bit for bit; also when the optimizer was reset just
    before the save (its empty state is restored as empty, not as a zero Adam step)."""
    first_batch, second_batch = _batch(seed=1), _batch(seed=2)
    a = _fsdp2(tiny_model_dir)
    a.train_step(first_batch, PPO)
    if reset:
        a.reset_optimizer()
    a.save_checkpoint(str(tmp_path / "ckpt"))
    straight = a.train_step(second_batch, PPO)
    b = _fsdp2(tiny_model_dir)
    b.load_checkpoint(str(tmp_path / "ckpt"))
    assert b.optimizer_steps == 1
    assert b.train_step(second_batch, PPO) == straight
    _assert_close(dict(b.named_weights()), dict(a.named_weights()), atol=0, rtol=0)


def test_hf_export_reloads_with_transformers(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    batch = _batch()
    fs = _fsdp2(tiny_model_dir)
    fs.train_step(batch, SFT_LOSS)
    fs.save_pretrained(str(tmp_path / "hf"))
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert type(model).__name__ == "Qwen2ForCausalLM"
    _assert_close({n: p.detach() for n, p in model.named_parameters()}, dict(fs.named_weights()), atol=0, rtol=0)
    want, _ = token_log_probs(model, batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(fs.compute_log_probs(batch)["log_probs"], want, atol=1e-6, rtol=1e-6)
    assert AutoTokenizer.from_pretrained(tmp_path / "hf").eos_token == "<|im_end|>"


def test_weight_buckets_and_load_weights(tiny_model_dir):
    """load_weights puts whole tensors into the shards (also right after a forward, which leaves the root unit
    gathered), where a step at lr 0 keeps them; named_weights and the buckets (in their plan's order, names,
    dtypes and shapes) give them back."""
    fs = _fsdp2(tiny_model_dir)
    gen = torch.Generator().manual_seed(3)
    new = {n: torch.randn(p.shape, generator=gen) for n, p in fs.model.named_parameters()}
    fs.compute_log_probs(_batch())
    fs.load_weights(new.items())
    fs.train_step(_batch(), SFT_LOSS, lr=0.0)
    _assert_close(dict(fs.named_weights()), new, atol=0, rtol=0)
    metas = fs.weight_bucket_metas(20_000)
    buckets = list(fs.weight_buckets(20_000))
    assert len(buckets) == len(metas) > 2
    for meta, bucket in zip(metas, buckets):
        assert [n for n, _ in bucket] == meta.names
        assert [list(t.shape) for _, t in bucket] == meta.shapes
        assert {str(t.dtype).removeprefix("torch.") for _, t in bucket} == set(meta.dtypes) == {"float32"}
        for name, tensor in bucket:
            assert torch.equal(tensor, new[name])
    with pytest.raises(KeyError, match="no parameter 'lm_head.weight'"):  # tied: not a separate parameter
        fs.load_weights([("lm_head.weight", new["model.embed_tokens.weight"])])


def test_fsdp2_infer_scores_like_the_plain_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    batch = _batch()
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    want_lp, want_ent = token_log_probs(plain, batch["input_ids"], batch["attention_mask"], with_entropy=True)
    for dynamic, pack in [(False, False), (True, True)]:
        ref = _fsdp2(tiny_model_dir, name="fsdp2_infer", role="reference", dynamic=dynamic, pack=pack)
        out = ref.compute_log_probs(batch, with_entropy=True)
        torch.testing.assert_close(out["log_probs"], want_lp, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out["entropy"], want_ent, atol=1e-5, rtol=1e-5)
    trained = _fsdp2(tiny_model_dir)
    trained.train_step(batch, SFT_LOSS)
    ref.load_weights(trained.named_weights())
    torch.testing.assert_close(
        ref.compute_log_probs(batch)["log_probs"], trained.compute_log_probs(batch)["log_probs"], atol=1e-5, rtol=1e-5
    )


def _critic_batch():
    batch = _batch()
    width = batch["input_ids"].shape[1] - 1
    batch["values"] = torch.zeros(len(batch), width)
    batch["returns"] = torch.linspace(-1, 1, len(batch) * width).view(len(batch), width)
    return batch


def test_critic_equals_deepspeed_critic(tiny_model_dir):
    from roll.strategies.deepspeed_train import DeepSpeedCriticStrategy

    batch = _critic_batch()
    critic_ds = _deepspeed(tiny_model_dir, role="critic")
    assert isinstance(critic_ds, DeepSpeedCriticStrategy)
    critic_fs = _fsdp2(tiny_model_dir, role="critic")
    loss = CriticValueLoss(0.5)
    want, got = critic_ds.train_step(batch, loss), critic_fs.train_step(batch, loss)
    assert set(got) == set(want) and "critic/grad_norm" in got
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-7), key
    _assert_close(_fsdp2_grads(critic_fs), _applied_grads(critic_ds))
    torch.testing.assert_close(
        critic_fs.compute_values(batch)["values"], critic_ds.compute_values(batch)["values"], atol=1e-6, rtol=1e-5
    )


# ---------------------------------------------------------------- two (and four) ranks over gloo
def run_peers(world: int, scenarios: str, model_dir: str, out: Path, options: str = "{}"):
    """Runs ``fsdp2_peer.py`` on ``world`` CPU ranks; returns ``load(scenario, rank)`` (``load.out``: the folder)."""
    from roll.distributed.group import free_port

    port, procs = free_port(), []
    for rank in range(world):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "LOCAL_RANK": "0",
            "WORLD_SIZE": str(world),
            "OMP_NUM_THREADS": "1",
            "CUDA_VISIBLE_DEVICES": "",
            "FSDP2_OPTIONS": options,
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(HERE / "fsdp2_peer.py"), scenarios, model_dir, str(out)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    logs = [p.communicate(timeout=300)[0] for p in procs]
    for proc, log in zip(procs, logs):
        assert proc.returncode == 0, log[-4000:]

    def load(scenario: str, rank: int):
        return torch.load(out / f"{scenario}_rank{rank}.pt", weights_only=False)

    load.out = out
    return load


@pytest.fixture(scope="module")
def two_ranks(tiny_model_dir, tmp_path_factory):
    """Every scenario of ``fsdp2_peer.py``, run once on two ranks."""
    return run_peers(2, "train,resume,weights,infer,critic", tiny_model_dir, tmp_path_factory.mktemp("fsdp2_2"))


@pytest.mark.slow
def test_two_ranks_match_deepspeed_on_one(two_ranks, tiny_model_dir):
    """Two ranks with 4 samples each (token-budget micro-batches: 3 on one rank, 2 and a dummy on the other) make
    the step deepspeed_train makes with all 8 on one rank; one reduce-scatter per FSDP unit, not per micro-batch."""
    from tests.strategies.fsdp2_peer import ORDER

    batch = _batch().select(ORDER)
    ds = _deepspeed(tiny_model_dir, dynamic=True)
    want = ds.train_step(batch, PPO)
    ranks = [two_ranks("train", r) for r in range(2)]
    chunks = batch.chunk(2)
    tokens = [PPO.normalizer(c) for c in chunks]
    loss = sum(t * r["metrics"]["actor/pg_loss"] for t, r in zip(tokens, ranks)) / sum(tokens)
    assert loss == pytest.approx(want["actor/pg_loss"], rel=1e-5)
    for r in ranks:
        assert want["actor/grad_norm"] > 0  # two zero norms would be "equal"
        assert r["metrics"]["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=1e-5)
        _assert_close(r["grads"], _applied_grads(ds))
        assert r["reduce_scatters"] == r["units"] == 3  # 2 decoder layers + the root
    assert [r["micro_batches"] for r in ranks] == [3, 2]


@pytest.mark.slow
def test_two_ranks_resume_exactly(two_ranks):
    for rank in range(2):
        result = two_ranks("resume", rank)
        (straight, w_straight), (resumed, w_resumed) = result["straight"], result["resumed"]
        _assert_close(result["loaded"], result["saved"], atol=0, rtol=0)
        assert resumed == straight and result["steps"] == (2, 2)
        _assert_close(w_resumed, w_straight, atol=0, rtol=0)


@pytest.mark.slow
def test_two_ranks_weights(two_ranks):
    for rank in range(2):
        result = two_ranks("weights", rank)
        names = [n for m in result["metas"] for n in m["names"]]
        assert [n for b in result["buckets"] for n, _ in b] == names == list(result["new"])
        for bucket in result["buckets"]:
            for name, tensor in bucket:
                assert torch.equal(tensor, result["new"][name]), name
        full = torch.arange(15, dtype=torch.float32).view(5, 3)
        assert torch.equal(result["odd_local"], full[:3] if rank == 0 else full[3:])  # uneven shards: 3 + 2 rows
        assert torch.equal(result["odd_full"], full)
    from transformers import AutoModelForCausalLM

    named, new = two_ranks("weights", 0)["named"], two_ranks("weights", 0)["new"]
    assert set(named) == set(new)
    exported = dict(AutoModelForCausalLM.from_pretrained(two_ranks.out / "hf").named_parameters())
    for name, tensor in named.items():
        assert torch.equal(tensor, new[name]) and torch.equal(exported[name].detach(), new[name]), name


@pytest.mark.slow
def test_two_ranks_reference_with_an_idle_rank(two_ranks, tiny_model_dir):
    """Rank 0 scores 7 samples (4 micro-batches), rank 1 none: rank 1 still joins every gather."""
    from transformers import AutoModelForCausalLM

    batch = _batch().select(range(7))
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    want, _ = token_log_probs(plain, batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(two_ranks("infer", 0)["log_probs"]["log_probs"], want, atol=1e-5, rtol=1e-5)
    assert two_ranks("infer", 1)["log_probs"]["log_probs"].shape == (0, 11)


@pytest.mark.slow
def test_two_ranks_critic_match_one(two_ranks, tiny_model_dir):
    want = _fsdp2(tiny_model_dir, role="critic")
    want.train_step(_critic_batch(), CriticValueLoss(0.5))
    for rank in range(2):
        _assert_close(two_ranks("critic", rank)["grads"], _fsdp2_grads(want))


@pytest.mark.slow
def test_hsdp_four_ranks_match_deepspeed_on_one(tiny_model_dir, tmp_path):
    """fsdp_size 2 on 4 ranks: two replicas of a model sharded over 2 ranks (a 2-D mesh) make the same step as one
    DeepSpeed rank on all 8 samples, and resume exactly."""
    from tests.strategies.fsdp2_peer import ORDER

    load = run_peers(4, "train,resume", tiny_model_dir, tmp_path, '{"fsdp_size": 2}')
    ds = _deepspeed(tiny_model_dir, dynamic=True)
    want = ds.train_step(_batch().select(ORDER), PPO)
    for rank in range(4):
        got = load("train", rank)
        assert got["mesh"] == (2, 2)
        assert want["actor/grad_norm"] > 0  # two zero norms would be "equal"
        assert got["metrics"]["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=1e-5)
        _assert_close(got["grads"], _applied_grads(ds))
        resumed = load("resume", rank)
        _assert_close(resumed["loaded"], resumed["saved"], atol=0, rtol=0)
        assert resumed["resumed"][0] == resumed["straight"][0]
