"""hf_infer's reuse of keys and values across turns: the same tokens and log-probs as re-encoding the history."""

from __future__ import annotations

import random

import pytest
import torch

from roll.config.worker import GeneratingArgs, WorkerConfig
from roll.strategies.base import StrategyContext
from roll.strategies.hf_infer import HFInferStrategy
from roll.strategies.registry import strategy_options
from roll.strategies.turn_cache import INDEX_TOKENS, TurnCache


def _strategy(model_dir: str, **options) -> HFInferStrategy:
    config = WorkerConfig()
    config.model_args.model_name_or_path = model_dir
    config.strategy_args.strategy_name = "hf_infer"
    config.strategy_args.strategy_config = dict(options)
    strategy = HFInferStrategy(config, 0, 1, options=strategy_options(config))
    strategy.initialize(StrategyContext(seed=0))
    return strategy


def _kv(length: int, value: float = 0.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.full((2, length, 4), value), torch.full((2, length, 4), value))]


def test_pop_prefix_takes_the_longest_proper_prefix_once():
    cache = TurnCache()
    base = list(range(100, 100 + INDEX_TOKENS))
    cache.store(base, _kv(len(base), 1.0))
    cache.store(base + [7, 8], _kv(len(base) + 2, 2.0))
    cache.store(base + [9], _kv(len(base) + 1, 3.0))
    length, kv = cache.pop_prefix(base + [7, 8, 5])
    assert length == len(base) + 2 and kv[0][0][0, 0, 0].item() == 2.0
    length, kv = cache.pop_prefix(base + [7, 8, 5])  # then the next longest; base + [9] is no prefix
    assert length == len(base) and kv[0][0][0, 0, 0].item() == 1.0
    assert len(cache) == 1
    # an equal-length prompt is not a proper prefix: at least one token must be left to feed the model
    cache = TurnCache()
    cache.store(base, _kv(len(base)))
    assert cache.pop_prefix(base) == (0, None)
    assert cache.pop_prefix(base[:-1] + [1, 2]) == (0, None)  # differs inside the indexed prefix
    assert cache.pop_prefix(base + [3])[0] == len(base)
    assert cache.pop_prefix(base + [3]) == (0, None)  # used once
    assert len(cache) == 0 and cache.bytes == 0


def test_byte_budget_drops_the_oldest_entries():
    one = 2 * 2 * INDEX_TOKENS * 4 * 4  # keys + values, float32
    cache = TurnCache(max_bytes=2 * one)
    seqs = [[i] * INDEX_TOKENS for i in range(3)]
    for s in seqs:
        cache.store(s, _kv(INDEX_TOKENS))
    assert len(cache) == 2 and cache.bytes == 2 * one
    assert cache.pop_prefix(seqs[0] + [1]) == (0, None)  # the oldest went first
    assert cache.pop_prefix(seqs[2] + [1])[0] == INDEX_TOKENS


@pytest.mark.parametrize("sample", [False, True])
def test_multi_turn_generation_matches_reencoding(tiny_model_dir, sample):
    """Four turns of six conversations of different lengths: tokens equal, log-probs within float noise."""
    reuse, plain = _strategy(tiny_model_dir), _strategy(tiny_model_dir, reuse_kv_cache=False)
    args = GeneratingArgs(max_new_tokens=6, temperature=1.0 if sample else 0.0, do_sample=sample)
    rng = random.Random(0)
    convs = [[rng.randrange(20, 400) for _ in range(rng.randrange(INDEX_TOKENS, 40))] for _ in range(6)]
    for turn in range(4):
        torch.manual_seed(turn)
        a = reuse.generate(convs, args)
        torch.manual_seed(turn)
        b = plain.generate(convs, args)
        assert [o.token_ids for o in a] == [o.token_ids for o in b]
        for x, y in zip(a, b):
            assert x.finish_reason == y.finish_reason
            assert max(abs(p - q) for p, q in zip(x.log_probs, y.log_probs)) < 1e-4
        convs = [
            c + o.token_ids + [rng.randrange(20, 400) for _ in range(rng.randrange(1, 10))] for c, o in zip(convs, a)
        ]
    cache = reuse.turn_cache
    assert cache.hits == 18 and cache.lookups == 24  # every turn after the first continued a stored sequence
    assert plain.turn_cache is None


def test_no_cache_deprecation_warning(tiny_model_dir):
    """transformers 5 renamed ``past_key_values`` to ``cache`` and warns (once per process) on the old name: hf_infer's
    turns with a reused cache, by the lean decode loop and by ``generate``, use the new one."""
    import logging

    from transformers.utils import logging as hf_logging

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    hf_logging.warning_once.cache_clear()  # a warning printed earlier in this process would hide a new one
    logging.getLogger("transformers").addHandler(handler)
    try:
        strategy, prompt = _strategy(tiny_model_dir), list(range(50, 50 + INDEX_TOKENS + 4))
        for penalty in (1.0, 1.1):  # a repetition penalty takes generate instead of the lean decode loop
            args = GeneratingArgs(max_new_tokens=3, temperature=0.0, do_sample=False, repetition_penalty=penalty)
            out = strategy.generate([prompt], args)
            strategy.generate([prompt + out[0].token_ids + [60]], args)  # the second turn reuses the cache
        assert strategy.turn_cache.hits == 2
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert not [r for r in records if "deprecated" in r], records


def test_new_weights_forget_the_kept_keys(tiny_model_dir):
    strategy = _strategy(tiny_model_dir)
    prompt = list(range(50, 50 + INDEX_TOKENS + 4))
    out = strategy.generate([prompt], GeneratingArgs(max_new_tokens=3, temperature=0.0, do_sample=False))
    assert len(strategy.turn_cache) == 1
    strategy.load_weights([(n, p.detach().clone()) for n, p in strategy.model.named_parameters()])
    assert len(strategy.turn_cache) == 0
    strategy.generate(
        [prompt + out[0].token_ids + [60]], GeneratingArgs(max_new_tokens=3, temperature=0.0, do_sample=False)
    )
    assert strategy.turn_cache.hits == 0


def test_unknown_option_is_named(tiny_model_dir):
    with pytest.raises(ValueError, match="kv_cache"):
        _strategy(tiny_model_dir, kv_cache=True)


def test_the_same_tokens_stored_twice_serve_two_lookups():
    """Envs of a group often answer alike: one copy of the keys, one use per store."""
    cache = TurnCache()
    seq = list(range(INDEX_TOKENS + 2))
    cache.store(seq, _kv(len(seq)))
    cache.store(seq, _kv(len(seq)))
    assert len(cache) == 1 and cache.bytes == 2 * 2 * len(seq) * 4 * 4
    assert cache.pop_prefix(seq + [1])[0] == len(seq)
    assert cache.pop_prefix(seq + [2])[0] == len(seq)
    assert cache.pop_prefix(seq + [3]) == (0, None)
