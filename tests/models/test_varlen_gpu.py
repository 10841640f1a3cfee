"""``roll_varlen`` attention (PyTorch's flash varlen kernel) on a GPU: packed rows give the padded SDPA forward's
log-probs and gradients within bf16 tolerance (skipped without a GPU; run by ``scripts/verify_gpu_step.sh``)."""

from __future__ import annotations

import pytest
import torch

from roll.models import varlen

pytestmark = pytest.mark.skipif(not varlen.available(), reason="needs CUDA and torch.nn.attention.varlen (GPU only)")

LENGTHS = [37, 5, 64, 18, 50, 9]


def _models(tmp_path):
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=1000,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).save_pretrained(tmp_path)
    dense = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16, attn_implementation="sdpa")
    packed = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16, attn_implementation=varlen.register())
    return dense.cuda(), packed.cuda()


def _batch():
    gen = torch.Generator().manual_seed(1)
    ids = torch.zeros(len(LENGTHS), max(LENGTHS), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(LENGTHS):
        ids[i, :n] = torch.randint(3, 990, (n,), generator=gen)
        mask[i, :n] = 1
    return ids.cuda(), mask.cuda()


@pytest.mark.parametrize("pack", [True, False])
def test_varlen_matches_padded_sdpa(tmp_path, pack):
    from roll.models.logprobs import token_log_probs

    dense, packed = _models(tmp_path)
    ids, mask = _batch()
    scored = (mask[:, 1:] * mask[:, :-1]).bool()
    grads = []
    outs = []
    for model, use_pack in ((dense, False), (packed, pack)):
        model.zero_grad()
        lp, ent = token_log_probs(model, ids, mask, with_entropy=True, pack=use_pack)
        (lp[scored].sum() + 0.1 * ent[scored].sum()).backward()
        outs.append((lp.detach(), ent.detach()))
        grads.append(torch.cat([p.grad.float().flatten() for p in model.parameters()]))
    torch.testing.assert_close(outs[1][0][scored], outs[0][0][scored], atol=0.05, rtol=0.02)
    torch.testing.assert_close(outs[1][1][scored], outs[0][1][scored], atol=0.05, rtol=0.02)
    cosine = torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0)
    assert cosine > 0.999, float(cosine)
