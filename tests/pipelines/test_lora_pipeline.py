"""``sokoban_tiny_lora`` end to end on CPU: RL steps with LoRA adapters on ``deepspeed_train`` and the adapter-only
sync (the engine, ``hf_infer``, serves the trainer's adapter through peft on its unchanged base weights), a KL loss
whose reference is the actor with its adapters off (no reference worker starts although the config has a reference
block), then the final adapter merged by ``roll merge-lora``.

What fails here: adapters without gradients (grad norm 0, the final adapter zero); a reference that is not the base
model (at step 1 the adapters are still zero, so the actor is the base and the KL must be exactly 0; later it must
not be); a sync that sends nothing, the base or a stale adapter (the engine's log-probs of a reply then differ from the
trainer's); a sync that sends more than the adapter (``sync/gib`` is the adapter's size); a base that trains (its
weights leave the pretrained ones).
"""

from __future__ import annotations

import pytest
import torch

from roll.models.lora import PEFT_PREFIX, is_peft
from roll.pipelines.agentic_pipeline import AgenticPipeline
from tests.pipelines.test_resume import STEPS, _config, _metrics_by_step
from tests.strategies.test_train_step import _batch


@pytest.mark.slow
def test_sokoban_tiny_lora_runs_and_keeps_the_base(tiny_model_dir, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    from roll.launch.cli import main

    out = tmp_path / "run"
    cfg = _config(
        tiny_model_dir,
        out,
        "use_kl_loss=true",
        "kl_loss_coef=0.01",
        "+reference.strategy_args.strategy_name=hf_infer",  # a reference block: not started with LoRA
        "actor_train.training_args.gradient_accumulation_steps=2",  # one optimizer step per rollout
        name="sokoban_tiny_lora",
    )
    pipe = AgenticPipeline(cfg)
    pipe.run()
    assert pipe.roles.reference is None
    assert "reference: not started; with LoRA the reference log-probs are actor_train's" in capsys.readouterr().out
    metrics = _metrics_by_step(out)
    for step in range(1, STEPS + 1):
        m = metrics[step]
        assert m["actor/grad_norm"] > 0, (step, m["actor/grad_norm"])
        assert m["critic/advantages_max"] > m["critic/advantages_min"], step  # a learning signal
        assert "time/ref_log_probs" in m
        assert m["sync/mode"] == 4.0, m["sync/mode"]  # adapter-only
    # step 1's one update starts from zero adapters, where the actor is the base model (to float rounding: the
    # training and the reference pass cut the batch into other micro-batches); after it, the two differ
    assert abs(metrics[1]["actor/ref_kl"]) < 1e-6, metrics[1]["actor/ref_kl"]
    assert all(abs(metrics[step]["actor/ref_kl"]) > 1e-5 for step in range(2, STEPS + 1))

    # the base weights did not move; the trainer exports base + merged adapters, which the engine holds
    strategy = pipe.roles.actor_train.group.workers[0].strategy
    plain = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters())
    with strategy._gathered():
        for name, param in strategy.engine.module.named_parameters():
            if ".lora_" not in name:
                plain_name = name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")
                assert torch.equal(param.detach(), plain[plain_name].detach()), name
    adapter_bytes = sum(t.numel() * t.element_size() for _, t in strategy.adapter_weights())
    assert metrics[STEPS]["sync/gib"] == pytest.approx(adapter_bytes / 2**30)
    full_bytes = sum(t.numel() * t.element_size() for t in plain.values())
    assert adapter_bytes < full_bytes / 2, (adapter_bytes, full_bytes)
    engine = pipe.roles.actor_infer.group.workers[0].strategy
    assert is_peft(engine.model)  # the engine serves the adapter; its base is the pretrained model
    for name, param in engine.model.named_parameters():
        if ".lora_" not in name:
            plain_name = name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")
            assert torch.equal(param.detach(), plain[plain_name].detach()), name
    batch = _batch(vocab=int(plain["model.embed_tokens.weight"].shape[0]))
    torch.testing.assert_close(
        engine.compute_log_probs(batch)["log_probs"],
        strategy.compute_log_probs(batch)["log_probs"],
        atol=1e-5,
        rtol=1e-5,
    )
    assert (out / "final" / "adapter_config.json").is_file()
    assert main(["merge-lora", str(out / "final"), "--out", str(tmp_path / "merged")]) == 0
    merged = dict(AutoModelForCausalLM.from_pretrained(tmp_path / "merged").named_parameters())
    for name, tensor in strategy.named_weights():
        torch.testing.assert_close(merged[name].detach(), tensor, atol=1e-6, rtol=1e-6, msg=name)
