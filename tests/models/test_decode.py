"""``roll.models.decode`` against transformers' ``generate``: the same tokens, log-probs and keys, bit for bit (one
differing logit anywhere fails), on Qwen2 with and without grouped heads and on Llama, with and without left padding,
greedy and sampled (temperature, top-k, top-p, a minimum length), with stop tokens and with a prefix cache; and
``hf_infer`` uses it on CPU where it applies, ``generate`` elsewhere."""

from __future__ import annotations

import pytest
import torch

from roll.models.decode import decode, unsupported
from roll.strategies.turn_cache import batch_layout
from tests.strategies.test_turn_cache import _strategy as hf_infer_strategy

VOCAB, STOPS, PAD = 96, [2, 7], 0


def tiny(kind: str):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        initializer_range=0.2,
        pad_token_id=PAD,
        eos_token_id=2,
    )
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**common, num_key_value_heads=2)).eval()
    return Qwen2ForCausalLM(Qwen2Config(**common, num_key_value_heads=2 if kind == "qwen2-gqa" else 4)).eval()


def prompts(padded: bool, batch: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``(input_ids, attention_mask)`` as hf_infer lays them out."""
    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(3, 12, (batch,), generator=gen) if padded else torch.full((batch,), 9)
    rows = [torch.randint(8, VOCAB, (n,), generator=gen).tolist() for n in lengths.tolist()]
    ids, mask, _ = batch_layout(rows, [0] * batch, PAD)
    return ids, mask


SAMPLING = {
    "greedy": dict(do_sample=False),
    "sampled": dict(do_sample=True, temperature=0.7, top_k=20, top_p=0.9),
    "plain": dict(do_sample=True),
    "min_length": dict(do_sample=True, min_new_tokens=12),
}


def reference(model, ids, mask, new_tokens: int, sampling: dict, past=None):
    """``generate`` as ``hf_infer`` calls it: (tokens, log-probs, cache)."""
    sample = sampling.get("do_sample", True)
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=new_tokens,
        do_sample=sample,
        temperature=sampling.get("temperature", 1.0) if sample else None,
        top_p=sampling.get("top_p", 1.0) if sample else None,
        top_k=sampling.get("top_k"),
        min_new_tokens=sampling.get("min_new_tokens"),
        eos_token_id=STOPS,
        pad_token_id=PAD,
        return_dict_in_generate=True,
        output_scores=True,
        past_key_values=past,
    )
    log_probs = model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
    return out.sequences[:, ids.shape[1] :], log_probs, out.past_key_values


def assert_same(ours, theirs, mask: torch.Tensor) -> None:
    """Tokens, log-probs, and keys and values wherever attended (the prompt's real tokens, every decoded one; what
    a padding column holds is never read)."""
    tokens, log_probs, cache = theirs
    assert torch.equal(ours.tokens, tokens)
    assert torch.equal(ours.log_probs, log_probs)
    attended = torch.cat([mask.bool(), torch.ones(mask.shape[0], tokens.shape[1] - 1, dtype=torch.bool)], 1)
    for a, b in zip(ours.cache.layers, cache.layers):
        assert a.keys.shape == b.keys.shape
        assert torch.equal(a.keys.transpose(1, 2)[attended], b.keys.transpose(1, 2)[attended])
        assert torch.equal(a.values.transpose(1, 2)[attended], b.values.transpose(1, 2)[attended])


@pytest.mark.parametrize("kind", ["qwen2-gqa", "qwen2", "llama"])
@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("mode", list(SAMPLING))
@torch.no_grad()
def test_decode_is_generate_bit_for_bit(kind, padded, mode):
    model, (ids, mask) = tiny(kind), prompts(padded)
    torch.manual_seed(3)
    theirs = reference(model, ids, mask, 16, SAMPLING[mode])
    torch.manual_seed(3)
    ours = decode(model, ids, mask, 16, stop_ids=STOPS, pad_id=PAD, **SAMPLING[mode])
    assert_same(ours, theirs, mask)
    assert ours.tokens.shape[1] > 1 and (ours.log_probs[:, 0] < 0).all()  # something was decoded and scored


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
@torch.no_grad()
def test_bfloat16_model_is_generate_bit_for_bit(mode):
    model, (ids, mask) = tiny("qwen2-gqa").to(torch.bfloat16), prompts(True)
    torch.manual_seed(3)
    theirs = reference(model, ids, mask, 12, SAMPLING[mode])
    torch.manual_seed(3)
    ours = decode(model, ids, mask, 12, stop_ids=STOPS, pad_id=PAD, **SAMPLING[mode])
    assert ours.cache.layers[0].keys.dtype == torch.bfloat16
    assert_same(ours, theirs, mask)


@torch.no_grad()
def test_rows_past_their_stop_token_hold_padding_and_decoding_ends_when_all_stop():
    model, (ids, mask) = tiny("qwen2-gqa"), prompts(True)
    model.lm_head.bias = torch.nn.Parameter(torch.zeros(VOCAB))
    model.lm_head.bias.data[STOPS[1]] = 4.0  # a likely stop: rows end at different steps
    torch.manual_seed(5)
    theirs = reference(model, ids, mask, 40, SAMPLING["plain"])
    torch.manual_seed(5)
    ours = decode(model, ids, mask, 40, stop_ids=STOPS, pad_id=PAD, do_sample=True)
    assert_same(ours, theirs, mask)
    assert ours.tokens.shape[1] < 40  # all rows stopped early
    for row in ours.tokens.tolist():
        end = next(i for i, t in enumerate(row) if t in STOPS)
        assert all(t == PAD for t in row[end + 1 :])


@torch.no_grad()
def test_continues_from_a_prefix_cache_as_generate_does():
    """hf_infer's layout for prompts whose first tokens have keys (a kept turn or a shared prefix): the cached
    columns first, then the rest of each prompt, both right-aligned."""
    from roll.strategies.turn_cache import batch_cache, split_cache

    model = tiny("qwen2-gqa")
    gen = torch.Generator().manual_seed(2)
    heads = [torch.randint(8, VOCAB, (n,), generator=gen).tolist() for n in (5, 8, 8, 3)]
    full = [h + torch.randint(8, VOCAB, (n,), generator=gen).tolist() for h, n in zip(heads, (4, 2, 6, 7))]
    head_ids, head_mask, _ = batch_layout(heads, [0] * len(heads), PAD)
    out = model(
        input_ids=head_ids,
        attention_mask=head_mask,
        use_cache=True,
        position_ids=(head_mask.cumsum(-1) - 1).clamp(min=0),
    )
    kvs = split_cache(out.past_key_values, head_mask, [0] * len(heads))
    cached = [len(h) for h in heads]
    ids, mask, width = batch_layout(full, cached, PAD)
    results = []
    for run in ("generate", "decode"):
        past = batch_cache(kvs, cached, width, kvs[0])
        torch.manual_seed(9)
        if run == "generate":
            results.append(reference(model, ids, mask, 10, SAMPLING["sampled"], past=past))
        else:
            results.append(
                decode(
                    model, ids, mask, 10, past=past, past_width=width, stop_ids=STOPS, pad_id=PAD, **SAMPLING["sampled"]
                )
            )
    assert_same(results[1], results[0], mask)


def test_unsupported_names_the_reason():
    from transformers import GPT2Config, GPT2LMHeadModel

    assert unsupported(tiny("qwen2")) is None and unsupported(tiny("llama")) is None
    assert "repetition_penalty" in unsupported(tiny("qwen2"), repetition_penalty=1.1)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2))
    assert "'gpt2'" in unsupported(gpt2)
    sliding = tiny("qwen2")
    sliding.config.layer_types = ["sliding_attention", "full_attention"]
    assert "sliding" in unsupported(sliding)
    from peft import LoraConfig, get_peft_model

    assert "peft" in unsupported(get_peft_model(tiny("qwen2"), LoraConfig(r=2, target_modules=["q_proj"])))


@pytest.mark.parametrize("penalty", [1.0, 1.2])
def test_hf_infer_decodes_with_it_on_cpu_and_falls_back_to_generate(tiny_model_dir, monkeypatch, penalty):
    """Two turns (the second continues kept keys; a group's shared prompt is prefilled once) give the same tokens
    and log-probs through the lean path as through ``generate``; the lean path runs only where it applies."""
    import roll.strategies.hf_infer as hf_infer
    from roll.config.worker import GeneratingArgs

    args = GeneratingArgs(max_new_tokens=6, do_sample=True, temperature=0.9, top_p=0.95, repetition_penalty=penalty)
    first = [[5, 6, 7, 8, 9, 10, 11, 12] * 3] * 3 + [[9, 10, 11, 12, 13] * 4]
    runs, calls = {}, []
    monkeypatch.setattr(hf_infer, "decode", lambda *a, **k: calls.append(1) or decode(*a, **k))
    for path in ("lean", "generate"):
        if path == "generate":
            monkeypatch.setattr(hf_infer, "decode_unsupported", lambda *a: "turned off in this test")
        strategy = hf_infer_strategy(tiny_model_dir)
        torch.manual_seed(0)
        outs = strategy.generate(first, args)
        second = [p + o.token_ids + [14, 15] for p, o in zip(first, outs)]
        outs += strategy.generate(second, args)
        runs[path] = [(o.token_ids, o.log_probs, o.finish_reason) for o in outs]
        if path == "lean":
            assert bool(calls) == (penalty == 1.0)
            calls.clear()
    assert not calls and runs["lean"] == runs["generate"]
    assert all(len(ids) == len(lps) > 0 for ids, lps, _ in runs["lean"])
