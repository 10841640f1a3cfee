"""Run a start script (``examples/start_*.py``) on many command lines in one fresh interpreter: each command line runs
as ``python <script> <args>`` would (``__main__``, ``sys.argv``, the working directory), with file descriptor 2
captured on its own, so each gets its own exit code and stderr. One interpreter instead of one per case saves the
start-up and imports (about 2 s each on 2 cores); import-time output still shows, in the first case's stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# the child: for each case, fd 2 into a file, run the script as __main__, the exit code as `python script` gives it
CHILD = r"""
import json, os, runpy, sys, tempfile, traceback
cases_file, results_file = sys.argv[1:3]
cases, results = json.load(open(cases_file)), []
for script, args, cwd in cases:
    with tempfile.TemporaryFile() as err:
        sys.stderr.flush()
        saved, here = os.dup(2), os.getcwd()
        os.dup2(err.fileno(), 2)
        os.chdir(cwd)
        sys.argv = [script, *args]
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            os.chdir(here)
        err.seek(0)
        results.append([code, err.read().decode(errors="replace")])
with open(results_file, "w") as f:
    json.dump(results, f)
"""


@dataclass
class Exit:
    """What one command line gave: its exit code and its stderr."""

    returncode: int
    stderr: str


def run_start_scripts(
    cases: list[tuple[Path, list[str]]], cwd: Path, env: dict[str, str] | None = None, timeout: float = 600
) -> list[Exit]:
    """Run each ``(script, args)`` of ``cases`` from ``cwd`` in one fresh interpreter (environment ``env``, default
    this one's); returns one :class:`Exit` per case, in order."""
    cases_file, results_file = cwd / "start_script_cases.json", cwd / "start_script_results.json"
    cases_file.write_text(json.dumps([[str(script), list(args), str(cwd)] for script, args in cases]))
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(cases_file), str(results_file)],
        cwd=cwd,
        env=env if env is not None else dict(os.environ),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0 and results_file.exists(), (
        f"the runner exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    )
    return [Exit(code, stderr) for code, stderr in json.loads(results_file.read_text())]
