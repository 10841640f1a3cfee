"""Reading record files: rows of a ``.parquet`` or ``.jsonl`` file as dicts (no torch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_records(path: str | Path, what: str = "data file") -> list[dict[str, Any]]:
    """Rows of a ``.parquet`` or ``.jsonl`` (also ``.json`` lines) file as dicts; ``what`` names the file in errors."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pandas as pd

        return pd.read_parquet(path).to_dict(orient="records")
    if suffix not in (".jsonl", ".json"):
        raise ValueError(f"{what} {str(path)!r} must be .jsonl or .parquet")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
