"""Data files: finding them (:func:`resolve_data_files`) and reading their rows as dicts (no torch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: File types a data file may have.
DATA_SUFFIXES = (".jsonl", ".json", ".parquet")
#: A relative data path is looked up in the working directory, then here (the repository root).
REPO_ROOT = Path(__file__).resolve().parents[2]


def resolve_data_files(files: list[str] | None) -> list[str]:
    """Absolute paths of ``files``: a relative path is looked up in the cwd, then in the repository root.

    Raises:
        ValueError: a file with an unsupported suffix, or one that exists in neither place (the message says where
            it looked and what is allowed).
    """
    resolved = []
    for name in files or []:
        path = Path(name)
        if path.suffix.lower() not in DATA_SUFFIXES:
            raise ValueError(f"{name}: unsupported file type; expected one of {', '.join(DATA_SUFFIXES)}")
        found = [p for p in (Path.cwd() / path, REPO_ROOT / path) if p.is_file()]
        if not found:
            raise ValueError(f"{name}: no such file (looked in the cwd {Path.cwd()} and in {REPO_ROOT})")
        resolved.append(str(found[0].resolve()))
    return resolved


def read_records(path: str | Path, what: str = "data file") -> list[dict[str, Any]]:
    """Rows of a ``.parquet`` or ``.jsonl`` (also ``.json`` lines) file as dicts; ``what`` names the file in errors."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pandas as pd

        records: list[dict[str, Any]] = pd.read_parquet(path).to_dict(orient="records")
        return records
    if suffix not in (".jsonl", ".json"):
        raise ValueError(f"{what} {str(path)!r} must be .jsonl or .parquet")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
