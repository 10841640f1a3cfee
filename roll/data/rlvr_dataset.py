"""RLVR prompt datasets: load and validate parquet/JSONL rows, then tokenize prompts with a chat template.

Row format (column names configurable): ``prompt`` (text) or a chat ``messages`` column (list of
``{"role", "content"}``), ``ground_truth`` (the reference answer; numbers are turned into text) and ``tag``
(the domain, which selects the reward function, e.g. ``"math"``). See ``docs/rlvr_data.md``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

MAX_LISTED_ERRORS = 20

Message = dict[str, str]


@dataclass(frozen=True)
class RLVRExample:
    """One prompt with its verifiable answer.

    Attributes:
        prompt: the prompt text, or a chat as a list of ``{"role": ..., "content": ...}`` messages.
        ground_truth: the reference answer, as text.
        tag: the domain (selects the reward function).
        row: 0-based position of the record in its file (blank JSONL lines are not counted).
        source: the file the record came from.
    """

    prompt: str | list[Message]
    ground_truth: str
    tag: str
    row: int
    source: str = ""


class DatasetValidationError(ValueError):
    """Raised once per load, listing every malformed row (file, row, problem)."""


@dataclass
class _Problems:
    """Collects per-row problems across files and raises them as one error."""

    items: list[str] = field(default_factory=list)

    def add(self, source: str, row: int | None, problem: str, line: int | None = None) -> None:
        where = source if row is None else f"{source} row {row}" + (f" (line {line})" if line else "")
        self.items.append(f"{where}: {problem}")

    def raise_if_any(self) -> None:
        if not self.items:
            return
        shown = self.items[:MAX_LISTED_ERRORS]
        more = len(self.items) - len(shown)
        lines = [f"{len(self.items)} malformed row(s); fix or remove them:", *("  " + s for s in shown)]
        if more:
            lines.append(f"  ... and {more} more")
        raise DatasetValidationError("\n".join(lines))


def _read_records(path: Path, problems: _Problems) -> list[tuple[dict[str, Any], int | None]]:
    """Records of a file as (dict, JSONL line number or None); invalid JSON lines are reported."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pandas as pd

        return [(rec, None) for rec in pd.read_parquet(path).to_dict(orient="records")]
    if suffix not in (".jsonl", ".json"):
        raise ValueError(f"unsupported dataset file {str(path)!r}: expected a .parquet or .jsonl file")
    records: list[tuple[dict[str, Any], int | None]] = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                problems.add(str(path), len(records), f"invalid JSON ({exc.msg})", line_no)
                rec = None
            if not isinstance(rec, dict) and rec is not None:
                problems.add(str(path), len(records), f"expected a JSON object, got {type(rec).__name__}", line_no)
            records.append((rec if isinstance(rec, dict) else {}, line_no))
    return records


def _check_columns(path: Path, records: list, columns: list[str], problems: _Problems) -> bool:
    """Report a file with no records, or a column absent from every record, as one file-level problem."""
    if not records:
        problems.add(str(path), None, "the file holds no records")
        return False
    present = {key for rec, _ in records for key in rec}
    absent = [c for c in columns if c not in present]
    if absent and present:
        problems.add(
            str(path),
            None,
            f"column(s) {absent} not found (columns present: {sorted(present)}); "
            "pass prompt_key= / messages_key= / ground_truth_key= / tag_key= to name them (or default_tag= for "
            "data without tags)",
        )
        return False
    return True


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _check_prompt(value: Any, is_messages: bool) -> tuple[str | list[Message] | None, str | None]:
    """(prompt, None) if valid, else (None, problem)."""
    if _is_missing(value):
        return None, "missing prompt"
    if not is_messages:
        if not isinstance(value, str):
            return None, f"prompt must be text, got {type(value).__name__}"
        return (value, None) if value.strip() else (None, "empty prompt")
    if hasattr(value, "tolist"):  # parquet list columns arrive as numpy arrays
        value = value.tolist()
    if not isinstance(value, list) or not value:
        return None, f"messages must be a non-empty list of {{role, content}} dicts, got {value!r:.60}"
    messages = []
    for i, msg in enumerate(value):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str) or not isinstance(msg.get("content"), str):
            return None, f"message {i} must be a dict with text 'role' and 'content', got {msg!r:.60}"
        messages.append({"role": msg["role"], "content": msg["content"]})
    if not any(m["content"].strip() for m in messages):
        return None, "empty prompt (all message contents are empty)"
    return messages, None


def _check_ground_truth(value: Any) -> tuple[str | None, str | None]:
    if _is_missing(value):
        return None, "missing ground_truth"
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None, f"ground_truth must be text or a number, got {type(value).__name__}"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).strip()
    return (text, None) if text else (None, "empty ground_truth")


def load_rlvr_dataset(
    path: str | Path | Sequence[str | Path],
    *,
    prompt_key: str = "prompt",
    messages_key: str | None = None,
    ground_truth_key: str = "ground_truth",
    tag_key: str = "tag",
    default_tag: str | None = None,
) -> list[RLVRExample]:
    """Load and validate RLVR examples from one or more parquet / JSONL files.

    Args:
        path: a file or a list of files (``.parquet``, ``.jsonl``); examples keep file and row order.
        prompt_key: column holding the prompt text (used when ``messages_key`` is None).
        messages_key: column holding chat messages instead of prompt text.
        ground_truth_key: column holding the reference answer.
        tag_key: column holding the domain tag.
        default_tag: the tag of rows without one (the column absent, or a null value); None: every row needs one.

    Raises:
        DatasetValidationError: once, listing every malformed row (file, row, problem; the first
            ``MAX_LISTED_ERRORS`` and a count of the rest). Rows are never dropped silently.
        FileNotFoundError / ValueError: for a missing file or an unsupported extension.
    """
    paths = [path] if isinstance(path, (str, Path)) else list(path)
    if not paths:
        raise ValueError("load_rlvr_dataset needs at least one file path, got an empty list")
    problems, examples = _Problems(), []
    prompt_col = messages_key or prompt_key
    for p in map(Path, paths):
        if not p.is_file():
            raise FileNotFoundError(f"dataset file {str(p)!r} does not exist")
        records = _read_records(p, problems)
        required = [prompt_col, ground_truth_key] + ([tag_key] if default_tag is None else [])
        if not _check_columns(p, records, required, problems):
            continue
        for row, (rec, line) in enumerate(records):
            if not rec:
                continue  # already reported as invalid JSON / not an object
            prompt, err_p = _check_prompt(rec.get(prompt_col), messages_key is not None)
            truth, err_t = _check_ground_truth(rec.get(ground_truth_key))
            tag = rec.get(tag_key)
            if _is_missing(tag) and default_tag is not None:
                tag = default_tag
            err_tag = (
                None
                if isinstance(tag, str) and tag.strip()
                else f"missing or empty tag {tag!r}" + ("" if default_tag is not None else " (default_tag sets one)")
            )
            errs = [e for e in (err_p, err_t, err_tag) if e]
            if errs:
                problems.add(str(p), row, "; ".join(errs), line)
                continue
            examples.append(RLVRExample(prompt, truth, tag, row, str(p)))  # type: ignore[arg-type]
    problems.raise_if_any()
    return examples


@dataclass
class EncodeReport:
    """What :func:`encode_prompts` did.

    Attributes:
        kept: indices (into the input examples) of the encoded prompts, in output order.
        filtered_rows: ``(source, row, length)`` of prompts dropped for being longer than ``prompt_length``.
        truncated_rows: ``(source, row, length)`` of prompts cut to ``prompt_length``.
        max_length: the longest prompt before truncation, in tokens.
    """

    kept: list[int] = field(default_factory=list)
    filtered_rows: list[tuple[str, int, int]] = field(default_factory=list)
    truncated_rows: list[tuple[str, int, int]] = field(default_factory=list)
    max_length: int = 0


def to_messages(example: RLVRExample, system_prompt: str | None = None) -> list[Message]:
    """The chat for ``example``: a text prompt becomes one user message; ``system_prompt`` is prepended
    unless the chat already starts with a system message."""
    messages = (
        [{"role": "user", "content": example.prompt}]
        if isinstance(example.prompt, str)
        else [dict(m) for m in example.prompt]
    )
    if system_prompt is not None and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def encode_prompts(
    examples: Sequence[RLVRExample],
    tokenizer: Any,
    *,
    prompt_length: int,
    truncation: Literal["error", "left", "right"] = "error",
    filter_overlong_prompts: bool = False,
    system_prompt: str | None = None,
) -> tuple[list[list[int]], EncodeReport]:
    """Tokenize prompts with the tokenizer's chat template (``add_generation_prompt=True``).

    Args:
        examples: the prompts.
        tokenizer: a Hugging Face tokenizer with a ``chat_template``.
        prompt_length: the most tokens a prompt may have.
        truncation: for a prompt longer than ``prompt_length``: ``"error"`` raises naming the row and its
            length; ``"left"`` keeps the last ``prompt_length`` tokens (the end of the prompt, with the
            generation prompt); ``"right"`` keeps the first ``prompt_length`` tokens.
        filter_overlong_prompts: drop overlong prompts instead (reported); ``truncation`` then never applies.
        system_prompt: a system message prepended to chats that do not start with one.

    Returns:
        ``(token_ids, report)``; ``token_ids[i]`` belongs to ``examples[report.kept[i]]``.
    """
    if truncation not in ("error", "left", "right"):
        raise ValueError(f"truncation={truncation!r} is not one of 'error', 'left', 'right'")
    if prompt_length < 1:
        raise ValueError(f"prompt_length must be >= 1, got {prompt_length}")
    texts = [
        tokenizer.apply_chat_template(to_messages(ex, system_prompt), tokenize=False, add_generation_prompt=True)
        for ex in examples
    ]
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    report, out = EncodeReport(), []
    for i, (ex, ids) in enumerate(zip(examples, encoded)):
        report.max_length = max(report.max_length, len(ids))
        if len(ids) > prompt_length:
            where = (ex.source, ex.row, len(ids))
            if filter_overlong_prompts:
                report.filtered_rows.append(where)
                continue
            if truncation == "error":
                raise ValueError(
                    f"{ex.source or 'examples'} row {ex.row}: prompt has {len(ids)} tokens, more than "
                    f"prompt_length={prompt_length}; raise prompt_length, set truncation='left'/'right', "
                    "or set filter_overlong_prompts=True"
                )
            ids = ids[-prompt_length:] if truncation == "left" else ids[:prompt_length]
            report.truncated_rows.append(where)
        report.kept.append(i)
        out.append(list(ids))
    return out, report
