"""Keys and values kept across the turns of a conversation, for ``hf_infer``.

A multi-turn prompt is the previous turn's prompt and response plus the new observation; re-encoding the whole
history every turn makes prefill grow with the square of the number of turns. :class:`TurnCache` keeps, per
sequence, the keys and values computed while generating, finds them again by token prefix, and lays a batch of
them out as one left-padded ``DynamicCache``. SGLang's radix cache does the same on GPU.

Layout of a batch row (``C`` = longest cached prefix, ``S`` = longest uncached suffix)::

    [pad .. | cached prefix (c_i) | pad .. | new tokens (s_i)]    width C + S
     <------------- C -----------> <---------- S ----------->

Pads are masked; positions come from the attention mask's running sum, so a cached key keeps the position its
rotary embedding was computed for.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from roll.weights.buckets import tensor_nbytes

#: Per layer, (keys, values) of one sequence: (kv_heads, length, head_dim) each.
SequenceKV = list[tuple[torch.Tensor, torch.Tensor]]

#: Prefix length that indexes entries (the rest is compared); shorter sequences are not worth keeping.
INDEX_TOKENS = 16


class TurnCache:
    """Per-sequence keys and values, looked up by the longest stored token prefix of a new prompt.

    An entry is used once per time it was stored (the next turn extends it and stores a longer one; the envs of a
    group often produce the same tokens, which share one copy); the least recently stored entries beyond
    ``max_bytes`` are dropped (finished conversations are never asked for again).
    """

    def __init__(self, max_bytes: int = 2**30):
        self.max_bytes, self.bytes = max_bytes, 0
        self._entries: OrderedDict[tuple[int, ...], list] = OrderedDict()  # key -> [kv, uses left]
        self._index: dict[tuple[int, ...], set[tuple[int, ...]]] = {}
        self.hits = self.lookups = self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget everything (weights changed: the stored keys and values are stale)."""
        self._entries.clear()
        self._index.clear()
        self.bytes = 0

    def store(self, tokens: list[int], kv: SequenceKV) -> None:
        if len(tokens) < INDEX_TOKENS:
            return
        key = tuple(tokens)
        if key in self._entries:
            self._entries[key][1] += 1
            self._entries.move_to_end(key)
            return
        self._entries[key] = [kv, 1]
        self.bytes += kv_bytes(kv)
        self._index.setdefault(key[:INDEX_TOKENS], set()).add(key)
        while self.bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def pop_prefix(self, prompt: list[int]) -> tuple[int, SequenceKV | None]:
        """The longest stored entry that is a proper prefix of ``prompt`` (removed), as ``(length, kv)``."""
        self.lookups += 1
        best = None
        for key in self._index.get(tuple(prompt[:INDEX_TOKENS]), ()):
            if len(key) < len(prompt) and (best is None or len(key) > len(best)) and prompt[: len(key)] == list(key):
                best = key
        if best is None:
            return 0, None
        entry = self._entries[best]
        kv, entry[1] = entry[0], entry[1] - 1
        if not entry[1]:
            self._drop(best)
        self.hits += 1
        self.reused_tokens += len(best)
        return len(best), kv

    def _drop(self, key: tuple[int, ...]) -> None:
        self.bytes -= kv_bytes(self._entries.pop(key)[0])
        bucket = self._index[key[:INDEX_TOKENS]]
        bucket.discard(key)
        if not bucket:
            del self._index[key[:INDEX_TOKENS]]


def kv_bytes(kv: SequenceKV) -> int:
    return sum(tensor_nbytes(k) + tensor_nbytes(v) for k, v in kv)


def batch_layout(prompts: list[list[int]], cached: list[int], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(input_ids, attention_mask, C)`` for the layout above; ``cached[i]`` tokens of prompt i have keys."""
    C = max(cached)
    S = max(len(p) - c for p, c in zip(prompts, cached))
    input_ids = torch.full((len(prompts), C + S), pad_id, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, (p, c) in enumerate(zip(prompts, cached)):
        input_ids[i, C - c : C], mask[i, C - c : C] = torch.tensor(p[:c], dtype=torch.long), 1
        input_ids[i, C + S - (len(p) - c) :], mask[i, C + S - (len(p) - c) :] = torch.tensor(p[c:], dtype=torch.long), 1
    return input_ids, mask, C


def batch_cache(kvs: list[SequenceKV | None], cached: list[int], width: int, like: SequenceKV):
    """A ``DynamicCache`` of ``width`` positions: row i holds ``kvs[i]`` right-aligned, zeros (masked) before."""
    from transformers import DynamicCache

    layers = []
    for layer, (k0, v0) in enumerate(like):
        heads, _, dim = k0.shape
        keys = k0.new_zeros((len(kvs), heads, width, dim))
        values = v0.new_zeros((len(kvs), heads, width, dim))
        for i, (kv, c) in enumerate(zip(kvs, cached)):
            if kv is not None and c:
                keys[i, :, width - c :], values[i, :, width - c :] = kv[layer]
        layers.append((keys, values))
    return DynamicCache(layers)


def split_cache(cache, mask: torch.Tensor, kept: list[int]) -> list[SequenceKV]:
    """Per row, the keys and values of the attended prompt positions plus the first ``kept[i]`` generated ones."""
    width = mask.shape[1]
    out = []
    for i, n in enumerate(kept):
        idx = torch.cat([mask[i].nonzero().flatten(), torch.arange(width, width + n)]).to(cache.layers[0].keys.device)
        out.append(
            [
                (layer.keys[i].index_select(1, idx).clone(), layer.values[i].index_select(1, idx).clone())
                for layer in cache.layers
            ]
        )
    return out
