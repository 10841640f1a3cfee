"""The token layout of training samples: the one place that knows where tokens, turns and scores sit.

A sample is one right-padded row of ``input_ids`` (L tokens): a prompt and the model's replies (several turns
in a multi-turn episode, with the env's observations between them). Two frames:

- the **token frame** (L): ``input_ids``, ``attention_mask``, ``response_mask`` (1 on tokens the model generated;
  never on prompts, observations or an end-of-turn token appended after a length cut);
- the **log-prob frame** (L-1): index ``p`` holds what predicts token ``p + 1`` (``log p(input_ids[p+1] |
  input_ids[:p+1])``). Log-probs, entropies, values, token rewards, advantages and returns live here; so does the
  loss mask (:func:`loss_mask` = ``response_mask[:, 1:]``) and a turn's span (:class:`SampleLayout.turn_spans`).

Scores sit on the last response token, in the log-prob frame (:func:`place_at_last_response`). The agentic
pipeline (:func:`trajectories_to_batch`), the RLVR pipeline (:func:`prompt_response_batch`), the losses and the
data checks all take positions from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import Tensor

from roll.data.batch import Batch
from roll.data.trajectory import Trajectory


def to_logprob_frame(x: Tensor) -> Tensor:
    """(B, L) token-frame values -> (B, L-1) log-prob frame: index ``p`` of the result is token ``p + 1``."""
    return x[:, 1:]


def loss_mask(response_mask: Tensor) -> Tensor:
    """(B, L) response mask -> (B, L-1) float mask of the log-prob frame: 1 where a generated token is scored."""
    return to_logprob_frame(response_mask).to(torch.float32)


def last_response_index(mask: Tensor) -> Tensor:
    """(B,) index of each row's last 1 in a (B, T) mask (e.g. :func:`loss_mask`); -1 for a row without any."""
    last = mask.shape[1] - 1 - torch.flip(mask, dims=[1]).argmax(dim=1)
    return torch.where(mask.sum(1) > 0, last, torch.full_like(last, -1))


def place_at_last_response(values: Tensor, mask: Tensor) -> Tensor:
    """(B,) per-sample values -> (B, T) zeros with each value at its row's last masked index (rows without a
    masked index stay 0). With the :func:`loss_mask`, that is the score's place: the last response token."""
    out = torch.zeros(mask.shape, dtype=torch.float32)
    last = last_response_index(mask)
    has = last >= 0
    out[has, last[has]] = values[has].to(out.dtype)
    return out


@dataclass
class SampleLayout:
    """The unpadded tokens of one sample and where its replies are.

    Attributes:
        ids: the token ids (prompt, replies, observations), as the model saw and produced them.
        response_mask: 1 per generated token, 0 elsewhere (same length as ``ids``).
        turn_spans: per reply, ``(start, end)`` in the log-prob frame: its generated tokens are scored at indices
            ``start .. end - 1`` (token ``p`` of ``ids`` is scored at ``p - 1``).
    """

    ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)

    def append(self, prompt: Sequence[int], reply: Sequence[int], generated: int | None = None) -> None:
        """Add a prompt (or observation) and the model's reply, of which the first ``generated`` tokens (default:
        all) were generated; the rest (an appended end-of-turn token) is not trained on."""
        generated = len(reply) if generated is None else generated
        start = len(self.ids) + len(prompt)
        self.ids += list(prompt) + list(reply)
        self.response_mask += [0] * len(prompt) + [1] * generated + [0] * (len(reply) - generated)
        self.turn_spans.append((start - 1, start - 1 + generated))


def trajectory_layout(traj: Trajectory) -> SampleLayout:
    """The layout of one episode: every turn's prompt delta, then its reply."""
    layout = SampleLayout()
    for turn in traj.turns:
        layout.append(turn.prompt_ids, turn.response_ids, turn.generated)
    return layout


def collate(layouts: Sequence[SampleLayout], scores: Tensor, pad_id: int) -> Batch:
    """Right-pad sample layouts into a batch: ``input_ids``, ``attention_mask``, ``response_mask`` (B, L);
    ``scores`` (B,); ``token_level_scores`` (B, L-1), each score at its sample's last response token."""
    n, width = len(layouts), max(len(s.ids) for s in layouts)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    response_mask = torch.zeros((n, width), dtype=torch.long)
    for i, sample in enumerate(layouts):
        input_ids[i, :len(sample.ids)] = torch.tensor(sample.ids, dtype=torch.long)
        attention_mask[i, :len(sample.ids)] = 1
        response_mask[i, :len(sample.ids)] = torch.tensor(sample.response_mask, dtype=torch.long)
    return Batch(tensors={"input_ids": input_ids, "attention_mask": attention_mask, "response_mask": response_mask,
                          "scores": scores, "token_level_scores": place_at_last_response(scores, loss_mask(
                              response_mask))})


def trajectories_to_batch(trajectories: Sequence[Trajectory], pad_id: int) -> Batch:
    """One sample per trajectory (:func:`trajectory_layout`, :func:`collate`), with metadata ``traj_id``,
    ``env_id``, ``group_id``, ``tag``, ``step_rewards`` (per turn), ``turn_spans`` (per turn, log-prob frame),
    ``turn_states`` (per turn: the observation it acted on; equal text = equal env state), ``truncated_by_length``
    and ``success``."""
    layouts = [trajectory_layout(t) for t in trajectories]
    batch = collate(layouts, torch.tensor([t.score for t in trajectories], dtype=torch.float32), pad_id)
    batch.meta.update({
        "traj_id": [t.traj_id for t in trajectories], "env_id": [t.env_id for t in trajectories],
        "group_id": [t.group_id for t in trajectories], "tag": [t.tag for t in trajectories],
        "step_rewards": [[turn.reward for turn in t.turns] for t in trajectories],
        "turn_spans": [s.turn_spans for s in layouts],
        "turn_states": [[turn.observation for turn in t.turns] for t in trajectories],
        "truncated_by_length": [t.truncated_by_length for t in trajectories],
        "success": [t.success for t in trajectories]})
    return batch


def prompt_response_batch(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
                          scores: Sequence[float], pad_id: int) -> Batch:
    """One single-turn sample per (prompt, response): every response token is generated (:func:`collate`)."""
    layouts = []
    for prompt, response in zip(prompts, responses):
        layout = SampleLayout()
        layout.append(prompt, response)
        layouts.append(layout)
    return collate(layouts, torch.tensor(list(scores), dtype=torch.float32), pad_id)


def _frame_log_probs(rows: Sequence[Sequence[tuple[int, Sequence[float]]]], width: int) -> tuple[Tensor, Tensor]:
    """Per row, ``(start, log_probs)`` runs -> ``values`` and ``mask`` (B, width-1) of the log-prob frame."""
    values = torch.zeros(len(rows), width - 1)
    mask = torch.zeros_like(values)
    for i, runs in enumerate(rows):
        for start, lps in runs:
            values[i, start:start + len(lps)] = torch.tensor(list(lps), dtype=values.dtype)
            mask[i, start:start + len(lps)] = 1.0
    return values, mask


def rollout_log_probs(trajectories: Sequence[Trajectory], width: int) -> tuple[Tensor, Tensor]:
    """The inference engine's sampling log-probs of each generated token, in the log-prob frame of a batch of
    ``width`` tokens: ``values`` (B, width-1) and ``mask`` (B, width-1), 1 where a generated token has an engine
    log-prob (never on an appended end-of-turn token)."""
    return _frame_log_probs([[(start, turn.response_log_probs[:turn.generated])
                              for turn, (start, _) in zip(traj.turns, trajectory_layout(traj).turn_spans)]
                             for traj in trajectories], width)


def response_log_probs(prompt_lengths: Sequence[int], log_probs: Sequence[Sequence[float]],
                       width: int) -> tuple[Tensor, Tensor]:
    """:func:`rollout_log_probs` of single-turn samples (:func:`prompt_response_batch`): sample ``i``'s engine
    log-probs ``log_probs[i]`` of its response after a prompt of ``prompt_lengths[i]`` tokens."""
    return _frame_log_probs([[(n - 1, lps)] for n, lps in zip(prompt_lengths, log_probs)], width)
