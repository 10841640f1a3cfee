"""Shared-prefix rows: the samples of a batch that begin with the same tokens (a GRPO group's prompt, the first
turn of an agentic group) run as one row, the common prefix once and then each sample's own tokens.

A row ``prefix, suffix_1, suffix_2, ...`` attends causally with one rule added: a suffix token sees the prefix and
earlier tokens of its own suffix, never another suffix. Its position ids continue the prefix's (``P, P+1, ...``), so
every token computes exactly what it computes in its own padded row, and the backward sums the prefix's gradient over
the samples that share it, as the padded batch does. What is saved: ``(k - 1) x P`` tokens of a ``k``-sample group
(8 samples of a 44-token prompt and 5-token answers: 84 tokens instead of 392).

:func:`shared_prefix_layout` plans the rows and the index maps; :func:`roll.models.logprobs.token_log_probs`
(``share_prefix=True``) runs them. Only the index bookkeeping lives here: no model, no autograd.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: A shared row holds at most this many times the batch's padded width of tokens (attention is quadratic in it).
MAX_ROW_WIDTHS = 4


def pair_cost(hidden_size: int) -> float:
    """Cost of one attention pair (query, key) relative to one token's weight matmuls, for the row planner: about
    ``4 d`` FLOPs per pair and layer against about ``2 x 16 d^2`` per token and layer for Qwen-like shapes, so
    ``1 / (8 d)`` in FLOPs, doubled for what FLOPs leave out: a shared row's mask makes attention compute every
    pair of the row with the unfused kernel (scores, mask, softmax in memory). Measured on CPU (tiny Qwen2, forward
    and backward): with ``1 / (8 d)`` the planner joined groups through a common system prompt into 724-token rows
    that ran 1.2x slower than the one-group rows ``1 / (4 d)`` picks; no grid shape got slower."""
    return 1.0 / (4 * hidden_size)


@dataclass(frozen=True)
class SharedPrefixLayout:
    """Rows, mask and index maps of a shared-prefix forward for a ``(B, L)`` batch.

    ``input_ids``, ``position_ids`` (G, W): the shared rows (right-padded with token 0, position 0);
    ``allowed`` (G, 1, W, W) bool: query ``q`` may attend key ``k``;
    ``src`` (U,): flat index into ``(G * W)`` of each distinct scored position, and ``labels`` (U,) its next token;
    ``dest`` (S,): flat index into the ``(B, L-1)`` log-prob frame of each scored position of the batch, whose value
    is distinct position ``pick`` (S,). Positions of a shared prefix are scored once (``U <= S``).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    allowed: torch.Tensor
    src: torch.Tensor
    labels: torch.Tensor
    dest: torch.Tensor
    pick: torch.Tensor

    def additive_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """``allowed`` as the float mask transformers adds to attention scores (0, or the dtype's minimum)."""
        mask = torch.zeros(self.allowed.shape, dtype=dtype, device=self.allowed.device)
        return mask.masked_fill_(~self.allowed, torch.finfo(dtype).min)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def plan_rows(samples: list[list[int]], max_row: int, pair: float = 0.0) -> list[tuple[int, list[int]]]:
    """``(prefix length, member sample indices)`` of each shared row, greedily over the samples in sorted order: a
    sample joins the current row when that lowers the cost, ``width + pair x width^2`` per row (tokens, and the
    attention pairs a masked row computes; :func:`pair_cost`), and the row stays within ``max_row`` tokens. Every
    member of 2 or more tokens keeps at least one token of its own.

    >>> plan_rows([[1, 2, 3], [1, 2, 4], [9, 9]], max_row=16)
    [(2, [0, 1]), (1, [2])]
    """
    cost = lambda width: width + pair * width * width  # noqa: E731
    rows: list[tuple[int, list[int]]] = []
    widths: list[int] = []
    for i in sorted(range(len(samples)), key=lambda k: samples[k]):
        n = len(samples[i])
        if rows:
            prefix, members = rows[-1]
            shared = min(prefix, _common_prefix(samples[members[-1]], samples[i]), n - 1)
            joined = shared + sum(len(samples[m]) - shared for m in members) + n - shared
            if shared > 0 and joined <= max_row and cost(joined) < cost(widths[-1]) + cost(n):
                rows[-1] = (shared, members + [i])
                widths[-1] = joined
                continue
        rows.append((n - 1 if n >= 2 else n, [i]))  # a sample of 0 or 1 tokens has no scored position
        widths.append(n)
    return rows


def shared_prefix_layout(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, pair: float = 0.0
) -> SharedPrefixLayout | None:
    """The :class:`SharedPrefixLayout` of a ``(B, L)`` batch whose rows each hold one contiguous run of real tokens
    (left or right padding), on the CPU, planned by :func:`plan_rows` (``pair``: its attention cost); None when a
    row's real tokens are not contiguous or no two samples share a row."""
    mask = attention_mask.bool().cpu()
    ids = input_ids.cpu()
    batch, length = ids.shape
    lengths = mask.sum(-1)
    starts = mask.long().argmax(-1)
    cols = torch.arange(length)[None]
    if not bool((mask == ((cols >= starts[:, None]) & (cols < (starts + lengths)[:, None]))).all()):
        return None
    samples = [ids[i, s : s + n].tolist() for i, (s, n) in enumerate(zip(starts.tolist(), lengths.tolist()))]
    plan = plan_rows(samples, MAX_ROW_WIDTHS * length, pair)
    if len(plan) == batch:  # nothing shared: the padded forward is cheaper (no mask)
        return None
    width = max(prefix + sum(len(samples[m]) - prefix for m in members) for prefix, members in plan)
    if width < 1:
        return None
    row_ids = torch.zeros(len(plan), width, dtype=ids.dtype)
    positions = torch.zeros(len(plan), width, dtype=torch.long)
    segment = torch.full((len(plan), width), -1, dtype=torch.long)  # 0: prefix, j + 1: member j, -1: padding
    src, labels, dest, pick = [], [], [], []
    for g, (prefix, members) in enumerate(plan):
        base = g * width
        head = samples[members[0]][:prefix]
        row_ids[g, :prefix] = torch.tensor(head, dtype=ids.dtype)
        positions[g, :prefix] = torch.arange(prefix)
        segment[g, :prefix] = 0
        first = len(src)  # the prefix's own positions 0..prefix-2, scored once for every member
        src.extend(range(base, base + prefix - 1))
        labels.extend(head[1:])
        offset = prefix
        for j, m in enumerate(members):
            tokens, n = samples[m], len(samples[m])
            own = n - prefix
            row_ids[g, offset : offset + own] = torch.tensor(tokens[prefix:], dtype=ids.dtype)
            positions[g, offset : offset + own] = torch.arange(prefix, n)
            segment[g, offset : offset + own] = j + 1
            frame = m * (length - 1) + int(starts[m])  # this sample's position 0 in the (B, L-1) frame
            dest.extend(range(frame, frame + prefix - 1))
            pick.extend(range(first, first + prefix - 1))
            # position prefix-1 (the prefix's last token) predicts this member's first own token; then its own
            # tokens up to the second to last predict the next
            pick.extend(range(len(src), len(src) + n - prefix))
            if own:
                src.append(base + prefix - 1)
                src.extend(range(base + offset, base + offset + own - 1))
            labels.extend(tokens[prefix:])
            dest.extend(range(frame + prefix - 1, frame + n - 1))
            offset += own
    q, k = segment[:, :, None], segment[:, None, :]
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    allowed = causal & ((k == 0) | (k == q))
    as_long = lambda values: torch.tensor(values, dtype=torch.long)  # noqa: E731
    return SharedPrefixLayout(
        input_ids=row_ids,
        position_ids=positions,
        allowed=allowed[:, None],
        src=as_long(src),
        labels=as_long(labels),
        dest=as_long(dest),
        pick=as_long(pick),
    )
