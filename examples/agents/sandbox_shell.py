"""A mini-swe-agent environment whose shell commands run in roll's sandbox, never on the host.

mini-swe-agent asks an *environment* to execute each command the model writes (``execute(action) -> {"output",
"returncode", "exception_info"}``); its ``LocalEnvironment`` runs them on the host. :class:`SandboxShell` keeps the
repository as files in memory and runs every command in a fresh sandbox of :func:`roll.envs.tool_use.sandbox.run_python`
(its own process group, no network, no PID or file access outside its scratch directory where the kernel allows;
docs/tool_use.md): the files are written into the scratch directory, ``bash -c <command>`` runs there, and the files
as the command left them come back as the repository's new state. Standard library only inside the sandbox:
``python`` is the sandbox's interpreter, without site-packages.
"""

from __future__ import annotations

import json
from typing import Any

from minisweagent.exceptions import Submitted

from roll.envs.tool_use.sandbox import run_python

#: Marks the line with the result, after whatever the command printed.
MARKER = "\x00roll-sandbox-result\x00"
#: What the model is shown of a command's output (characters).
MAX_OUTPUT = 4000

# Runs inside the sandbox: write the files, run the command, report output, exit code and the files.
_DRIVER = """
import json, os, subprocess, sys
files, command, timeout = json.loads({payload!r})
for path, text in files.items():
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
env = dict(os.environ, PATH=os.path.dirname(sys.executable) + ":" + os.environ["PATH"], PYTHONDONTWRITEBYTECODE="1")
try:
    done = subprocess.run(["bash", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", timeout=timeout, env=env)
    output, code = done.stdout, done.returncode
except subprocess.TimeoutExpired as exc:
    output, code = (exc.output or b"").decode(errors="replace") + "\\n(timed out)", -1
seen = {{}}
for root, dirs, names in os.walk("."):
    dirs[:] = [d for d in dirs if d != "__pycache__"]
    for name in names:
        path = os.path.relpath(os.path.join(root, name))
        try:
            with open(path) as f:
                seen[path] = f.read(65536)
        except (OSError, UnicodeDecodeError):
            pass
print({marker!r} + json.dumps({{"output": output[-{cap}:], "returncode": code, "files": seen}}))
"""


class SandboxShell:
    """mini-swe-agent's ``Environment`` protocol over roll's sandbox.

    Args:
        files: the repository, ``{relative path: text}``; commands change it.
        timeout: seconds a command may run (the sandbox kills it and everything it started).
    """

    def __init__(self, files: dict[str, str], timeout: float = 20.0):
        self.files, self.timeout = dict(files), timeout
        self.config = {"timeout": timeout}
        self.commands: list[tuple[str, int]] = []  # what ran, with its exit code

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Run ``action["command"]`` in a fresh sandbox over the repository; mini-swe-agent's output dict."""
        command = action.get("command", "")
        limit = float(timeout or self.timeout)
        payload = json.dumps([self.files, command, limit])
        code = _DRIVER.format(payload=payload, marker=MARKER, cap=MAX_OUTPUT)
        result = run_python(
            code,
            allow_processes=True,  # bash and what it starts, inside the sandbox
            wall_timeout_s=limit + 5.0,
            cpu_time_s=int(limit) + 5,
            memory_mb=1024,
            max_output_bytes=1 << 20,
        )
        head, _, tail = result.stdout.rpartition(MARKER)
        if not tail:
            output = {
                "output": (head + result.stderr)[-MAX_OUTPUT:],
                "returncode": -1,
                "exception_info": f"the sandbox stopped the command: {result.error}",
            }
        else:
            report = json.loads(tail)
            self.files = report["files"]
            output = {"output": report["output"], "returncode": report["returncode"], "exception_info": ""}
        self.commands.append((command, output["returncode"]))
        self._check_finished(output)
        return output

    def _check_finished(self, output: dict[str, Any]) -> None:
        """mini-swe-agent's submission rule: a command whose output starts with the submit line ends the run."""
        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted(
                {"role": "exit", "content": submission, "extra": {"exit_status": "Submitted", "submission": submission}}
            )

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return {**self.config, **kwargs}

    def serialize(self) -> dict[str, Any]:
        return {"info": {"config": {"environment": self.config, "environment_type": "SandboxShell"}}}
