"""The fused GPU kernels (skipped without a GPU; run by ``scripts/verify_gpu_step.sh prepare``): the compiled
log-softmax / entropy math of the LM-head pass equals the eager math, and a model with Liger's kernels gives the
plain model's log-probs, entropy and gradients within bf16 tolerance."""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (GPU only)")

LENGTHS = [37, 5, 64, 18, 50, 9]


def _save_model(path, vocab: int = 1000) -> None:
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=vocab,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).save_pretrained(path)


def _batch(vocab: int = 1000):
    gen = torch.Generator().manual_seed(1)
    ids = torch.zeros(len(LENGTHS), max(LENGTHS), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(LENGTHS):
        ids[i, :n] = torch.randint(3, vocab - 10, (n,), generator=gen)
        mask[i, :n] = 1
    return ids.cuda(), mask.cuda()


def _log_probs_and_grads(model, ids, mask, compiled: bool, pack: bool = True):
    from roll.models.logprobs import token_log_probs

    model.zero_grad()
    lp, ent = token_log_probs(model, ids, mask, with_entropy=True, pack=pack, compiled=compiled, chunk_tokens=64)
    scored = (mask[:, 1:] * mask[:, :-1]).bool()
    (lp[scored].sum() + 0.1 * ent[scored].sum()).backward()
    grads = torch.cat([p.grad.float().flatten() for p in model.parameters()])
    return lp.detach()[scored], ent.detach()[scored], grads


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_compiled_chunk_math_equals_eager(temperature):
    from roll.models.logprobs import _kernels, _logit_grad_eager, logit_grad, logit_stats

    stats, grad_fn = _kernels(torch.device("cuda"), compiled=True)
    assert stats is not logit_stats and grad_fn not in (logit_grad, _logit_grad_eager)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for n in (7, 300):  # two sizes: one compiled kernel for every chunk length (dynamic shapes)
        logits = (3 * torch.randn(n, 5000, device="cuda", generator=gen)).to(torch.bfloat16)
        labels = torch.randint(0, 5000, (n,), device="cuda", generator=gen)
        want = logit_stats(logits, labels, temperature, True)
        got = stats(logits, labels, temperature, True)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)
        g_lp, g_ent = torch.randn(n, device="cuda", generator=gen), torch.randn(n, device="cuda", generator=gen)
        want_g = logit_grad(logits, labels, want[1], want[2], g_lp, g_ent, temperature, torch.float32)
        got_g = grad_fn(logits, labels, want[1], want[2], g_lp, g_ent, temperature, torch.float32)
        torch.testing.assert_close(got_g, want_g, atol=2e-6, rtol=1e-4)


def test_compiled_log_probs_match_eager_in_a_model(tmp_path):
    from transformers import AutoModelForCausalLM

    _save_model(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).cuda()
    ids, mask = _batch()
    eager = _log_probs_and_grads(model, ids, mask, compiled=False)
    fused = _log_probs_and_grads(model, ids, mask, compiled=True)
    torch.testing.assert_close(fused[0], eager[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(fused[1], eager[1], atol=1e-4, rtol=1e-4)
    assert torch.nn.functional.cosine_similarity(fused[2], eager[2], dim=0) > 0.9999


@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is None, reason="needs liger-kernel")
@pytest.mark.parametrize("pack", [True, False])
def test_liger_model_matches_plain(tmp_path, pack):
    from roll.models.loading import load_causal_lm

    _save_model(tmp_path)
    plain = load_causal_lm(str(tmp_path), "bf16").cuda()
    ids, mask = _batch()
    want = _log_probs_and_grads(plain, ids, mask, compiled=True, pack=pack)
    liger = load_causal_lm(str(tmp_path), "bf16", use_liger_kernel=True).cuda()
    assert "Liger" in repr(liger.model.layers[0].mlp) and "Liger" in repr(liger.model.norm)
    got = _log_probs_and_grads(liger, ids, mask, compiled=True, pack=pack)
    torch.testing.assert_close(got[0], want[0], atol=0.05, rtol=0.02)
    torch.testing.assert_close(got[1], want[1], atol=0.05, rtol=0.02)
    cosine = torch.nn.functional.cosine_similarity(got[2], want[2], dim=0)
    assert cosine > 0.999, float(cosine)
