"""Build the static trajectory viewer of a run: ``roll view <run dir | logging_dir | dump file>``.

The viewer is a folder that opens from disk (``file://``) with no server and no network: ``index.html``, its
stylesheet and scripts (copied from this package), ``dashboard.png`` (:func:`roll.tracking.plot.draw_dashboard`)
and ``data/``: ``run.js`` (metrics per step, chart series, the list of dumps) and one script per dump file. Data
travels as scripts, not JSON, because browsers refuse ``fetch`` on ``file://`` pages; a dump's script is loaded only
when its step is opened. The observation frames of a dump (``step_<n>_frames/``, :mod:`roll.tracking.frames`) are
copied to ``data/frames/<phase>/`` and shown as images (``<img>`` may load files on ``file://`` pages), each turn's
``src`` rewritten to that copy.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roll.tracking.dumps import DUMP_DIR, PHASES

ASSETS = Path(__file__).parent / "assets"
ASSET_FILES = ("index.html", "viewer.css", "render.js", "trajectory.js", "viewer.js")


@dataclass
class RunFiles:
    """What a viewer is built from: the logging directory (if known), the dump files and ``meta.json``."""

    log_dir: Path | None
    dumps: list[tuple[str, int, Path]] = field(default_factory=list)  # (phase, step, file), in step order
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def metrics(self) -> Path | None:
        path = self.log_dir / "metrics.jsonl" if self.log_dir else None
        return path if path and path.is_file() else None


def _step_of(path: Path) -> int:
    """``step_00020.jsonl`` -> 20."""
    stem = path.stem
    if not stem.startswith("step_") or not stem[5:].isdigit():
        raise ValueError(f"{path}: a dump file is named step_<step>.jsonl (e.g. step_00020.jsonl)")
    return int(stem[5:])


def find_run(source: str | Path) -> RunFiles:
    """Locate the dumps and metrics of ``source``: a run's ``output_dir`` (with ``logs/``), a ``logging_dir``, its
    ``trajectories/`` folder, or one dump file (``.../trajectories/<phase>/step_<n>.jsonl``).

    Raises:
        FileNotFoundError: ``source`` does not exist, or holds neither dumps nor ``metrics.jsonl``.
    """
    src = Path(source).expanduser().resolve()
    if not src.exists():
        raise FileNotFoundError(f"{source}: no such file or directory")
    if src.is_file():
        phase = src.parent.name if src.parent.name in PHASES else "train"
        root = src.parent.parent if src.parent.name in PHASES else src.parent
        log_dir = root.parent if root.name == DUMP_DIR else None
        return RunFiles(log_dir, [(phase, _step_of(src), src)], _read_meta(root / "meta.json"))
    candidates = [src.parent] if src.name == DUMP_DIR else [src, src / "logs"]
    for log_dir in candidates:
        dump_root = log_dir / DUMP_DIR
        if dump_root.is_dir() or (log_dir / "metrics.jsonl").is_file():
            dumps = sorted(
                ((phase, _step_of(p), p) for phase in PHASES for p in (dump_root / phase).glob("step_*.jsonl")),
                key=lambda d: (d[1], d[0]),
            )
            return RunFiles(log_dir, dumps, _read_meta(dump_root / "meta.json"))
    raise FileNotFoundError(
        f"{source}: no {DUMP_DIR}/ folder or metrics.jsonl here or in {src / 'logs'}; pass a "
        f"run's output_dir, its logging_dir or a dump file (set trajectory_dump_steps / "
        f"rollout_dump_steps to write dumps)"
    )


def _read_meta(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _read_records(path: Path) -> list[dict[str, Any]]:
    records = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                warnings.warn(f"{path}:{lineno}: skipping a line that is not JSON", stacklevel=2)
    return records


def _script(variable: str, key: str | None, value: Any) -> str:
    """A script assigning ``value`` (as JSON) to ``window[variable]`` or to ``window[variable][key]``."""
    # NaN / Infinity (not JSON, but valid JavaScript) pass through: a stray value must not stop the build
    payload = json.dumps(value, separators=(",", ":"), ensure_ascii=True)
    if key is None:
        return f"window.{variable} = {payload};\n"
    return f"(window.{variable} = window.{variable} || {{}})[{json.dumps(key)}] = {payload};\n"


def _copy_frames(path: Path, records: list[dict[str, Any]], dest: Path) -> None:
    """Copy the frames of dump file ``path`` under ``dest`` and point each kept frame's ``src`` at the copy (relative
    to the viewer's ``index.html``); a frame file that is missing becomes a dropped frame saying so."""
    for record in records:
        for turn in record.get("turns") or []:
            for frame in turn.get("frames") or []:
                if "src" not in frame:
                    continue
                source = path.parent / frame["src"]
                if not source.is_file():
                    frame["dropped"] = f"frame file {source} is missing"
                    del frame["src"]
                    continue
                target = dest / frame["src"]
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)
                frame["src"] = target.relative_to(dest.parent.parent.parent).as_posix()


def _dump_summary(phase: str, step: int, records: list[dict[str, Any]], file: str) -> dict[str, Any]:
    n = max(1, len(records))
    return {
        "phase": phase,
        "step": step,
        "file": file,
        "count": len(records),
        "groups": len({r.get("group") for r in records}),
        "success": sum(bool(r.get("success")) for r in records) / n,
        "score": sum(float(r.get("score") or 0.0) for r in records) / n,
    }


def build_viewer(source: str | Path, out: str | Path | None = None, title: str | None = None) -> Path:
    """Write the viewer of ``source`` (see :func:`find_run`) to ``out`` (default: ``<logging_dir>/viewer``, or
    ``<dump file>_viewer`` next to a lone dump file); returns the path of its ``index.html``."""
    from roll.tracking.viewer.metrics import metrics_payload

    run = find_run(source)
    if out is None and (Path(source).is_file() or run.log_dir is None):
        out = run.dumps[0][2].with_name(run.dumps[0][2].stem + "_viewer")
    out = Path(out) if out is not None else run.log_dir / "viewer"
    data = out / "data"
    if data.is_dir():
        shutil.rmtree(data)  # dumps of an earlier build that the run no longer has
    data.mkdir(parents=True)
    for name in ASSET_FILES:
        shutil.copyfile(ASSETS / name, out / name)
    summaries = []
    for phase, step, path in run.dumps:
        records = _read_records(path)
        _copy_frames(path, records, data / "frames" / phase)
        name = f"{phase}_{step:05d}.js"
        (data / name).write_text(_script("ROLL_DUMPS", f"{phase}/{step}", records), encoding="utf-8")
        summaries.append(_dump_summary(phase, step, records, f"data/{name}"))
    payload: dict[str, Any] = {
        "title": title or _default_title(run),
        "source": str(run.log_dir or source),
        "pipeline": run.meta.get("pipeline", "agentic"),
        "envs": run.meta.get("envs", {}),
        "dumps": summaries,
    }
    payload.update(metrics_payload(run.metrics, out / "dashboard.png", payload["title"]))
    (data / "run.js").write_text(_script("ROLL_RUN", None, payload), encoding="utf-8")
    return out / "index.html"


def _default_title(run: RunFiles) -> str:
    if run.log_dir is None:
        return run.dumps[0][2].name
    return run.log_dir.parent.name if run.log_dir.name == "logs" else run.log_dir.name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``roll view``."""
    parser.add_argument(
        "source",
        help="a run's output_dir or logging_dir, or one dump file "
        "(<logging_dir>/trajectories/<train|val>/step_<n>.jsonl)",
    )
    parser.add_argument("-o", "--out", help="output folder (default: <logging_dir>/viewer)")
    parser.add_argument("--title", help="title shown in the page (default: the run's folder name)")
    parser.add_argument("--open", action="store_true", help="open the page in the default web browser")


def run(args: argparse.Namespace) -> int:
    """``roll view``: build the viewer and print where it is; exit status 2 for a bad source."""
    try:
        index = build_viewer(args.source, args.out, args.title)
    except (FileNotFoundError, ValueError) as err:
        print(f"roll view: {err}", file=sys.stderr)
        return 2
    print(f"wrote {index}\nopen it in a browser: {index.as_uri()}")
    if args.open:
        import webbrowser

        webbrowser.open(index.as_uri())
    return 0
