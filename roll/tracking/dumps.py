"""Trajectory dumps: what the model saw and said, what the env answered, and which tokens got which advantage.

A pipeline makes one :class:`TrajectoryDumps` in ``setup`` and calls it once per step after the advantages are
computed (``train``) and once per validation round (``val``); ``roll view`` turns the files into a viewer.

Layout under ``<logging_dir>/trajectories/``:

- ``meta.json``: ``{"format": 1, "pipeline": "agentic" | "rlvr", "envs": {tag: {"env_type", "grid_symbols"}}}``
  (a tag played by an agent harness: ``{"env_type": null, "agent_runner": <import path>, "grid_symbols": null}``);
- ``train/step_<step:05d>.jsonl`` every ``every`` steps, ``val/step_<step:05d>.jsonl`` at every validation;
  one JSON object per trajectory (RLVR: per response), at most ``cap`` per file: whole groups in rollout
  order, so a group is never cut (unless one group alone exceeds the cap). Validation seeds are fixed, so the
  val files of different steps hold the same rooms (prompts) and can be compared.

A record::

    {"id": "train-3-g0-e1-t0", "group": 0, "tag": "SimpleSokoban", "case": "SimpleSokoban/1234",
     "seed": 1234, "score": 10.6, "success": true, "failure": null, "truncated": false, "metrics": {...},
     "final_observation": "#___\\n...",
     "turns": [{"prompt": "<|im_start|>user\\n...", "observation": "#__P\\n...", "response": "<answer>Up</answer>",
                "action": "Up", "valid": true, "reward": -0.1, "finish": "stop",
                "tokens": ["<answer>", "Up", "</answer>", "<|im_end|>"], "mask": [1, 1, 1, 1],
                "adv": [0.52, 0.52, 0.52, 0.52], "logp": [-0.01, -0.3, 0.0, -0.02]}]}

A record of a harness tag (``agent_runner`` in ``meta.json``) adds ``"harness"`` (the runner's import path) and
``"messages"``: the conversation as the harness sent it (``{"role", "content"}``; tool calls as ``<tool_call>``
text); its turns' ``observation`` is the last message before each reply.

``failure`` is null, or (agentic) the one-line error of a trajectory that an env exception, timeout or non-finite
reward ended; such records follow the batch's, carry ``"error": {"kind", "type", "at", "turn", "traceback"}`` (see
``roll.agentic.failures``; ``traceback``: the whole traceback, chained causes included, or null) and have no ``adv``
(they are not trained on). ``final_observation`` is what the env showed after the last action (agentic). ``case``
names the start state (env tag and seed; RLVR: data file name and row): equal across steps for the same room or
prompt. ``tokens`` are the reply's tokens decoded one by one; ``mask`` is the response mask (1 = trained on; 0 e.g.
for an end-of-turn token appended after a length cut); ``adv`` the advantage of each token (train files only) and
``logp`` the inference engine's sampling log-probability (when it reports one). A turn whose observation had
images (``Turn.images``, vision-language envs) adds ``frames``, and its record ``frame_counts``: PNG files in
``<phase>/step_<step:05d>_frames/``, bounded per episode and per frame (:mod:`roll.tracking.frames`); image parts of
a harness's ``messages`` are ``[image]`` markers there. RLVR records have one turn (the
prompt and the response) and add ``ground_truth``, ``source``, ``row`` and ``format_ok``.

This module imports nothing of roll: trajectories, prompt groups and batches are read through the attributes
named in the protocols below.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from roll.tracking.frames import FrameBudget, FrameWriter

FORMAT_VERSION = 1
DUMP_DIR = "trajectories"
PHASES = ("train", "val")


class TurnLike(Protocol):
    """What a dump reads from one turn (``roll.data.trajectory.Turn``)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_log_probs: list[float]
    observation: str
    response_text: str
    parsed_action: str | None
    action_is_valid: bool
    reward: float
    finish_reason: str
    appended_eos: bool
    images: Sequence[Any]


class TrajectoryLike(Protocol):
    """What a dump reads from one episode (``roll.data.trajectory.Trajectory``)."""

    traj_id: str
    env_id: int
    group_id: int
    tag: str
    seed: int
    turns: Sequence[TurnLike]
    success: bool
    truncated_by_length: bool
    failure: str | None
    failure_kind: str | None
    failure_type: str | None
    failure_at: str | None
    failure_turn: int | None
    failure_traceback: str | None
    env_metrics: dict[str, float]
    final_observation: str | None
    messages: list[dict[str, str]]

    @property
    def score(self) -> float: ...


class PromptGroupLike(Protocol):
    """What a dump reads from one prompt's responses (``roll.pipelines.rlvr_pipeline.PromptGroup``)."""

    index: int
    prompt_ids: list[int]
    response_ids: list[list[int]]
    texts: list[str]
    scores: list[float]
    correct: list[bool]
    format_ok: list[bool]
    truncated: list[bool]


class ExampleLike(Protocol):
    """What a dump reads from a prompt's dataset record (``roll.data.rlvr_dataset.RLVRExample``)."""

    ground_truth: str
    tag: str
    row: int
    source: str


class TokenizerLike(Protocol):
    """Decodes token ids (a Hugging Face tokenizer)."""

    def batch_decode(self, sequences: list[list[int]], skip_special_tokens: bool = ...) -> list[str]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class BatchLike(Protocol):
    """The training batch (``roll.data.batch.Batch``): tensors by key."""

    def __contains__(self, key: str) -> bool: ...

    def __getitem__(self, key: str) -> Any: ...


class TokenLayout:
    """Per-row token values of a batch, for the rows ``rows`` only: ``response_mask`` (B, L) and ``advantages``
    (B, L-1, log-prob frame: index p - 1 belongs to the token at position p). Either may be absent (validation has
    no advantages)."""

    def __init__(self, batch: BatchLike | None, rows: Sequence[int]):
        self.index = {row: k for k, row in enumerate(rows)}
        has = (lambda key: key in batch) if batch is not None else (lambda key: False)
        self.mask = batch["response_mask"][list(rows)].tolist() if has("response_mask") else None
        self.adv = batch["advantages"][list(rows)].float().tolist() if has("advantages") else None

    def span(self, row: int, start: int, n: int) -> dict[str, list]:
        """``mask``/``adv`` of the ``n`` tokens at positions ``start .. start + n - 1`` of batch row ``row``."""
        out: dict[str, list] = {}
        k = self.index[row]
        if self.mask is not None:
            out["mask"] = [int(m) for m in self.mask[k][start : start + n]]
        if self.adv is not None:
            out["adv"] = [num(a, 4) for a in self.adv[k][start - 1 : start - 1 + n]]
        return out


def reply_places(batch: BatchLike | None, trajectories: Sequence[TrajectoryLike], keep: Sequence[int]) -> dict:
    """Where each reply of the kept trajectories sits in ``batch``: ``{i: [(row, token position of the reply's first
    token), ...] per turn}``. An agentic batch (``roll.data.layout.trajectories_to_batch``) says which rows hold an
    episode (``episode``: one row per episode, or several: ``trajectory_mode: step``, template breaks) and where its
    replies are (``turn_spans``, log-prob frame: position = start + 1); a batch without them has one row per
    trajectory with its turns in order. Empty without a batch."""
    if batch is None:
        return {i: [] for i in keep}
    if "episode" in batch and "turn_spans" in batch:
        rows: dict[int, list[tuple[int, int]]] = {}
        for row, (episode, spans) in enumerate(zip(batch["episode"], batch["turn_spans"])):
            rows.setdefault(int(episode), []).extend((row, start + 1) for start, _ in spans)
        places = {i: rows.get(i, []) for i in keep}
    else:
        places = {}
        for i in keep:
            pos, places[i] = 0, []
            for turn in trajectories[i].turns:
                pos += len(turn.prompt_ids)
                places[i].append((i, pos))
                pos += len(turn.response_ids)
    for i in keep:
        if len(places[i]) != len(trajectories[i].turns):
            raise ValueError(
                f"dump: the batch holds {len(places[i])} replies of trajectory {trajectories[i].traj_id}, which has "
                f"{len(trajectories[i].turns)} turns: the batch was not built from these trajectories"
            )
    return places


def text_of(content: Any) -> Any:
    """A message's content for a dump: a list of OpenAI content parts becomes their text, each image part a
    ``[image]`` marker (its pixels are the turn's ``frames``); other content is kept."""
    if not isinstance(content, list):
        return content
    return "".join(
        str(part.get("text", "")) if part.get("type") == "text" else "[image]"
        for part in content
        if isinstance(part, dict)
    )


def num(value: float, digits: int) -> float | None:
    """``value`` rounded to ``digits`` decimals; None (JSON null) for NaN and infinities, which JSON lacks."""
    value = float(value)
    return round(value, digits) if math.isfinite(value) else None


def pick_whole_groups(group_ids: Sequence[Any], cap: int) -> list[int]:
    """Indices of the items to keep: whole groups in order of first appearance while the total stays within
    ``cap``; the first group is cut to ``cap`` when it alone is larger. ``cap <= 0`` keeps everything."""
    if cap <= 0 or len(group_ids) <= cap:
        return list(range(len(group_ids)))
    members: dict[Any, list[int]] = {}
    for i, g in enumerate(group_ids):
        members.setdefault(g, []).append(i)
    kept: list[int] = []
    for idx in members.values():
        if len(kept) + len(idx) > cap:
            return kept or idx[:cap]
        kept += idx
    return kept


class TrajectoryDumps:
    """Writes the dumps of one run (see the module docstring for the layout and the record format).

    Args:
        log_dir: the run's ``logging_dir``; files go to ``<log_dir>/trajectories``.
        every: write training trajectories every this many steps (0: never, and no validation dumps either).
        cap: at most this many trajectories (RLVR: responses) per file (0: no limit).
        tokenizer: decodes prompts and single tokens.
        pipeline: ``"agentic"`` or ``"rlvr"`` (recorded in ``meta.json`` for the viewer).
        envs: per env tag, ``{"env_type": ..., "grid_symbols": {symbol: name} | None}``, or for a tag played by an
            agent harness ``{"env_type": None, "agent_runner": ..., "grid_symbols": None}`` (agentic).
        frames: the bounds on the observation frames kept (:mod:`roll.tracking.frames`; agentic); None keeps none.
    """

    def __init__(
        self,
        log_dir: str | Path,
        every: int,
        cap: int,
        tokenizer: TokenizerLike,
        pipeline: str,
        envs: Mapping[str, Mapping[str, Any]] | None = None,
        frames: FrameBudget | None = None,
    ):
        if every < 0 or cap < 0:
            raise ValueError(f"dump every={every}, cap={cap}: both must be >= 0 (0 = never / no limit)")
        self.root = Path(log_dir) / DUMP_DIR
        self.every, self.cap, self.tokenizer, self.frames = every, cap, tokenizer, frames
        self.meta = {
            "format": FORMAT_VERSION,
            "pipeline": pipeline,
            "envs": {k: dict(v) for k, v in (envs or {}).items()},
        }

    def due(self, phase: str, step: int) -> bool:
        """Whether ``phase`` at ``step`` is dumped: train every ``every`` steps, val whenever dumps are on."""
        if phase not in PHASES:
            raise ValueError(f"phase={phase!r}: expected one of {PHASES}")
        return self.every > 0 and (phase == "val" or step % self.every == 0)

    def agentic(
        self,
        phase: str,
        step: int,
        trajectories: Sequence[TrajectoryLike],
        batch: BatchLike | None = None,
        failed: Sequence[TrajectoryLike] = (),
        force: bool = False,
    ) -> Path | None:
        """Dump multi-turn ``trajectories`` (rows of ``batch`` in the same order, when given), then the ``failed``
        ones (each capped at ``cap``); returns the file written, or None when ``phase`` at ``step`` is not due
        (``force``: due whenever dumps are on, e.g. for the failures of a rollout that stops the run)."""
        if not (self.due(phase, step) or (force and self.every > 0)):
            return None
        keep = pick_whole_groups([t.group_id for t in trajectories], self.cap)
        places = reply_places(batch, trajectories, keep)
        layout = TokenLayout(batch, sorted({row for ps in places.values() for row, _ in ps}))
        errors = list(range(len(failed) if self.cap <= 0 else min(len(failed), self.cap)))
        no_rows = TokenLayout(None, [])
        writer = FrameWriter(self.root / phase / f"step_{step:05d}_frames", self.frames)
        records = [self._episode(trajectories[i], places[i], layout, writer) for i in keep]
        return self._write(phase, step, records + [self._episode(failed[i], [], no_rows, writer) for i in errors])

    def rlvr(
        self,
        phase: str,
        step: int,
        groups: Sequence[PromptGroupLike],
        examples: Sequence[ExampleLike],
        batch: BatchLike | None = None,
    ) -> Path | None:
        """Dump the responses of prompt ``groups`` (``examples[g.index]`` is a group's record; rows of ``batch``
        are the responses in group order); returns the file written, or None when not due."""
        if not self.due(phase, step):
            return None
        flat = [(k, j) for k, g in enumerate(groups) for j in range(len(g.response_ids))]
        keep = pick_whole_groups([k for k, _ in flat], self.cap)
        layout = TokenLayout(batch, keep)
        records = (
            self._response(phase, step, groups[flat[i][0]], flat[i][0], flat[i][1], examples, i, layout) for i in keep
        )
        return self._write(phase, step, records)

    # ------------------------------------------------------------------ records
    def _tokens(self, ids: Sequence[int]) -> list[str]:
        return self.tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False) if ids else []

    def _episode(
        self, traj: TrajectoryLike, places: list[tuple[int, int]], layout: TokenLayout, writer: FrameWriter
    ) -> dict[str, Any]:
        """One record; ``places``: each reply's (batch row, token position) (:func:`reply_places`), empty without a
        batch; ``writer`` writes the turns' frames."""
        frames, frame_counts = writer.episode(traj.traj_id, [turn.images for turn in traj.turns])
        turns = []
        for k, turn in enumerate(traj.turns):
            n = len(turn.response_ids)
            entry: dict[str, Any] = {
                "prompt": self.tokenizer.decode(turn.prompt_ids, skip_special_tokens=False),
                "observation": turn.observation,
                "response": turn.response_text,
                "action": turn.parsed_action,
                "valid": bool(turn.action_is_valid),
                "reward": num(turn.reward, 6),
                "finish": turn.finish_reason,
                "tokens": self._tokens(turn.response_ids),
            }
            if layout.mask is None:  # no batch: the mask follows the token layout of the batch
                entry["mask"] = [1] * (n - int(turn.appended_eos)) + [0] * int(turn.appended_eos)
            if places:
                entry.update(layout.span(*places[k], n))
            if turn.response_log_probs:
                entry["logp"] = [num(x, 3) for x in turn.response_log_probs[:n]]
            if frames[k]:
                entry["frames"] = frames[k]
            turns.append(entry)
        return {
            "id": traj.traj_id,
            "group": traj.group_id,
            "env": traj.env_id,
            "tag": traj.tag,
            "case": f"{traj.tag}/{traj.seed}",
            "seed": traj.seed,
            "score": num(traj.score, 6),
            "success": bool(traj.success),
            "failure": traj.failure,
            "truncated": bool(traj.truncated_by_length),
            "metrics": {k: num(v, 6) for k, v in traj.env_metrics.items()},
            "turns": turns,
            "final_observation": traj.final_observation,
            **({"frame_counts": frame_counts} if frame_counts else {}),
            **self._harness(traj),
            **(
                {
                    "error": {
                        "kind": traj.failure_kind,
                        "type": traj.failure_type,
                        "at": traj.failure_at,
                        "turn": traj.failure_turn,
                        "traceback": traj.failure_traceback,
                    }
                }
                if traj.failure
                else {}
            ),
        }

    def _harness(self, traj: TrajectoryLike) -> dict[str, Any]:
        """``harness`` and ``messages`` of an episode of a harness tag (nothing for an env tag)."""
        runner = self.meta["envs"].get(traj.tag, {}).get("agent_runner")
        if not runner:
            return {}
        return {
            "harness": runner,
            "messages": [{k: text_of(v) if k == "content" else v for k, v in m.items()} for m in traj.messages],
        }

    def _response(
        self,
        phase: str,
        step: int,
        group: PromptGroupLike,
        k: int,
        j: int,
        examples: Sequence[ExampleLike],
        row: int,
        layout: TokenLayout,
    ) -> dict[str, Any]:
        ex = examples[group.index]
        ids = group.response_ids[j]
        turn = {
            "prompt": self.tokenizer.decode(group.prompt_ids, skip_special_tokens=False),
            "observation": None,
            "response": group.texts[j],
            "action": None,
            "valid": bool(group.format_ok[j]),
            "reward": num(group.scores[j], 6),
            "finish": "length" if group.truncated[j] else "stop",
            "tokens": self._tokens(ids),
        }
        if layout.mask is None:
            turn["mask"] = [1] * len(ids)
        turn.update(layout.span(row, len(group.prompt_ids), len(ids)))
        return {
            "id": f"{phase}-{step}-p{k}-r{j}",
            "group": k,
            "tag": ex.tag,
            "case": f"{os.path.basename(ex.source)}:{ex.row}",
            "seed": group.index,
            "score": num(group.scores[j], 6),
            "success": bool(group.correct[j]),
            "failure": None,
            "truncated": bool(group.truncated[j]),
            "ground_truth": ex.ground_truth,
            "source": ex.source,
            "row": ex.row,
            "format_ok": bool(group.format_ok[j]),
            "turns": [turn],
        }

    def _write(self, phase: str, step: int, records: Iterable[dict[str, Any]]) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "meta.json").write_text(json.dumps(self.meta, indent=1))
        path = self.root / phase / f"step_{step:05d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n")
        return path
