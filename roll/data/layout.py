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

An episode may have several samples (:data:`TRAJECTORY_MODES`: one per turn in ``step`` mode; in ``traj`` mode a
new one at each turn that ``starts_sample``). The **episode frame** puts an episode's samples side by side in one
row (:func:`to_episode_frame`, :func:`episode_view`), which is where its advantages are computed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

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


#: How a trajectory becomes samples (``trajectory_mode``): ``traj`` merges turns into one sample while each turn's
#: prompt extends the previous prompt and reply (a turn that ``starts_sample`` starts a new one); ``step`` makes
#: every turn a sample: the ids the engine was given, then the reply.
TRAJECTORY_MODES = ("traj", "step")


def sample_turns(traj: Trajectory, mode: str = "traj") -> list[list[int]]:
    """The turn indices of each sample of ``traj``: ``step``: one turn each; ``traj``: runs of turns, a new run at
    every turn that ``starts_sample``.

    >>> from roll.data.trajectory import Turn
    >>> turns = [Turn([1], [2], [0.0], ""), Turn([3], [4], [0.0], "", starts_sample=True), Turn([5], [6], [0.0], "")]
    >>> sample_turns(Trajectory("t", 0, 0, "x", 0, turns)), sample_turns(Trajectory("t", 0, 0, "x", 0, turns), "step")
    ([[0], [1, 2]], [[0], [1], [2]])
    """
    if mode not in TRAJECTORY_MODES:
        raise ValueError(f"trajectory_mode={mode!r}: expected one of {', '.join(TRAJECTORY_MODES)}")
    runs: list[list[int]] = []
    for k, turn in enumerate(traj.turns):
        if mode == "step" or not runs or turn.starts_sample:
            runs.append([])
        runs[-1].append(k)
    return runs


def sample_layouts(traj: Trajectory, mode: str = "traj") -> list[SampleLayout]:
    """The samples of one episode (:func:`sample_turns`). Every sample trains only on ids the engine was given and
    produced: a ``step`` sample's prompt is the turn's whole engine prompt (the sample so far plus the turn's
    prompt, or the turn's prompt alone where it ``starts_sample``)."""
    out: list[SampleLayout] = []
    context: list[int] = []  # the ids the engine had before the current turn's prompt
    for run in sample_turns(traj, mode):
        layout = SampleLayout()
        for k in run:
            turn = traj.turns[k]
            if turn.starts_sample:
                context = []
            prompt = context + turn.prompt_ids if mode == "step" else turn.prompt_ids
            layout.append(prompt, turn.response_ids, turn.generated)
            context = context + turn.prompt_ids + turn.response_ids
        out.append(layout)
    return out


def sample_images(traj: Trajectory, mode: str = "traj") -> list[list]:
    """The images of each sample of ``traj`` (:func:`sample_layouts`), in the order their image tokens appear: a
    ``traj`` sample's turns' images; a ``step`` sample's also those of the context turns before it."""
    out: list[list] = []
    context: list = []  # the images of the ids the engine had before the current turn's prompt
    for run in sample_turns(traj, mode):
        images: list = []
        for k in run:
            turn = traj.turns[k]
            if turn.starts_sample:
                context = []
            images += (context + turn.images) if mode == "step" else turn.images
            context = context + turn.images
        out.append(images)
    return out


def collate(layouts: Sequence[SampleLayout], scores: Tensor, pad_id: int) -> Batch:
    """Right-pad sample layouts into a batch: ``input_ids``, ``attention_mask``, ``response_mask`` (B, L);
    ``scores`` (B,); ``token_level_scores`` (B, L-1), each score at its sample's last response token."""
    n, width = len(layouts), max(len(s.ids) for s in layouts)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    response_mask = torch.zeros((n, width), dtype=torch.long)
    for i, sample in enumerate(layouts):
        input_ids[i, : len(sample.ids)] = torch.tensor(sample.ids, dtype=torch.long)
        attention_mask[i, : len(sample.ids)] = 1
        response_mask[i, : len(sample.ids)] = torch.tensor(sample.response_mask, dtype=torch.long)
    return Batch(
        tensors={
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "response_mask": response_mask,
            "scores": scores,
            "token_level_scores": place_at_last_response(scores, loss_mask(response_mask)),
        }
    )


Modes = str | Mapping[str, str]  # one trajectory_mode, or one per env tag (a tag not named: "traj")


def _mode(modes: Modes, traj: Trajectory) -> str:
    return modes if isinstance(modes, str) else modes.get(traj.tag, "traj")


def trajectories_to_batch(trajectories: Sequence[Trajectory], pad_id: int, mode: Modes = "traj") -> Batch:
    """The samples of every trajectory (:func:`sample_layouts`, :func:`collate`; one per trajectory in ``traj``
    mode without template breaks), each with its episode's score and metadata ``traj_id``, ``env_id``,
    ``group_id``, ``tag``, ``truncated_by_length``, ``success``, ``episode`` (the index of its trajectory), and per
    turn of the sample ``step_rewards``, ``turn_spans`` (log-prob frame) and ``turn_states`` (the observation it
    acted on; equal text = equal env state). ``episode_fraction`` (B,) is 1 / the samples of its episode. Where
    observations had images, ``images`` too (per sample, :func:`sample_images`); a vision-language actor's
    ``pixel_values`` / ``image_grid_thw`` are made from them (:func:`roll.models.vision.add_pixel_values`)."""
    layouts, turns, episode, images = [], [], [], []
    for e, traj in enumerate(trajectories):
        m = _mode(mode, traj)
        for run, layout, pictures in zip(sample_turns(traj, m), sample_layouts(traj, m), sample_images(traj, m)):
            layouts.append(layout)
            turns.append([traj.turns[k] for k in run])
            episode.append(e)
            images.append(pictures)
    counts = Counter(episode)
    eps = [trajectories[e] for e in episode]
    batch = collate(layouts, torch.tensor([t.score for t in eps], dtype=torch.float32), pad_id)
    batch["episode_fraction"] = torch.tensor([1.0 / counts[e] for e in episode], dtype=torch.float32)
    batch.meta.update(
        {
            "traj_id": [t.traj_id for t in eps],
            "env_id": [t.env_id for t in eps],
            "group_id": [t.group_id for t in eps],
            "tag": [t.tag for t in eps],
            "episode": episode,
            "step_rewards": [[turn.reward for turn in ts] for ts in turns],
            "turn_spans": [s.turn_spans for s in layouts],
            "turn_states": [[turn.observation for turn in ts] for ts in turns],
            "truncated_by_length": [t.truncated_by_length for t in eps],
            "success": [t.success for t in eps],
        }
    )
    if any(images):  # episodes with image observations (vision-language actors): each sample's images, in order
        batch["images"] = images
    return batch


def episode_rows(batch: Batch) -> list[list[int]]:
    """The rows of each episode of a :func:`trajectories_to_batch` batch, in sample order (one row per episode
    without ``episode`` metadata)."""
    episode = batch["episode"] if "episode" in batch else list(range(len(batch)))
    rows: dict[int, list[int]] = {}
    for i, e in enumerate(episode):
        rows.setdefault(e, []).append(i)
    return list(rows.values())


def several_samples(batch: Batch) -> bool:
    """Whether some episode of ``batch`` has several samples (``step`` mode, or template breaks)."""
    return "episode" in batch and len(set(batch["episode"])) < len(batch)


def to_episode_frame(x: Tensor, rows: Sequence[Sequence[int]]) -> Tensor:
    """(S, T) per-sample values -> (E, K*T): episode ``e``'s samples ``rows[e]`` side by side (K = the most
    samples of an episode; zeros after an episode's last sample). Only masked positions matter to the
    estimators (:mod:`roll.algorithms.returns` skips the rest), so the episode frame is the samples' replies in
    order."""
    width = x.shape[1]
    out = x.new_zeros((len(rows), max(len(r) for r in rows) * width))
    for e, r in enumerate(rows):
        out[e, : len(r) * width] = x[list(r)].reshape(-1)
    return out


def from_episode_frame(y: Tensor, rows: Sequence[Sequence[int]], width: int) -> Tensor:
    """The inverse of :func:`to_episode_frame`: (E, K*width) -> (S, width)."""
    out = y.new_zeros((sum(len(r) for r in rows), width))
    for e, r in enumerate(rows):
        out[list(r)] = y[e, : len(r) * width].reshape(len(r), width)
    return out


def episode_view(batch: Batch) -> Batch:
    """One row per episode of a batch with several samples per episode, in the episode frame
    (:func:`to_episode_frame`): ``response_mask`` (a leading 0 column + the loss masks side by side), ``scores``,
    ``token_level_scores`` and, where present, ``old_log_probs``, ``ref_log_probs``, ``values``; metadata
    ``traj_id``, ``env_id``, ``group_id``, ``tag``, ``success`` and the turns' ``step_rewards``, ``turn_states``
    and ``turn_spans`` (shifted into the frame). What is computed per token on it maps back with
    :func:`from_episode_frame`."""
    rows = episode_rows(batch)
    width = batch["response_mask"].shape[1] - 1
    mask = to_episode_frame(loss_mask(batch["response_mask"]), rows)
    first = [r[0] for r in rows]
    scores = batch["scores"][first]
    tensors = {
        "response_mask": torch.cat([torch.zeros(len(rows), 1), mask], dim=1).long(),
        "scores": scores,
        "token_level_scores": place_at_last_response(scores, mask),
    }
    for key in ("old_log_probs", "ref_log_probs", "values"):
        if key in batch.tensors:
            tensors[key] = to_episode_frame(batch[key], rows)
    meta = {
        key: [batch[key][i] for i in first]
        for key in ("traj_id", "env_id", "group_id", "tag", "success")
        if key in batch
    }
    for key in ("step_rewards", "turn_states"):
        meta[key] = [[x for i in r for x in batch[key][i]] for r in rows]
    meta["turn_spans"] = [
        [(a + j * width, b + j * width) for j, i in enumerate(r) for a, b in batch["turn_spans"][i]] for r in rows
    ]
    return Batch(tensors, meta, dict(batch.info))


def prompt_response_batch(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], scores: Sequence[float], pad_id: int
) -> Batch:
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
            values[i, start : start + len(lps)] = torch.tensor(list(lps), dtype=values.dtype)
            mask[i, start : start + len(lps)] = 1.0
    return values, mask


def rollout_log_probs(trajectories: Sequence[Trajectory], width: int, mode: Modes = "traj") -> tuple[Tensor, Tensor]:
    """The inference engine's sampling log-probs of each generated token, in the log-prob frame of the batch of
    :func:`trajectories_to_batch` (``mode``) of ``width`` tokens: ``values`` (B, width-1) and ``mask`` (B, width-1),
    1 where a generated token has an engine log-prob (never on an appended end-of-turn token)."""
    rows = []
    for traj in trajectories:
        m = _mode(mode, traj)
        for run, layout in zip(sample_turns(traj, m), sample_layouts(traj, m)):
            rows.append(
                [
                    (start, traj.turns[k].response_log_probs[: traj.turns[k].generated])
                    for k, (start, _) in zip(run, layout.turn_spans)
                ]
            )
    return _frame_log_probs(rows, width)


def response_log_probs(
    prompt_lengths: Sequence[int], log_probs: Sequence[Sequence[float]], width: int
) -> tuple[Tensor, Tensor]:
    """:func:`rollout_log_probs` of single-turn samples (:func:`prompt_response_batch`): sample ``i``'s engine
    log-probs ``log_probs[i]`` of its response after a prompt of ``prompt_lengths[i]`` tokens."""
    return _frame_log_probs([[(n - 1, lps)] for n, lps in zip(prompt_lengths, log_probs)], width)
