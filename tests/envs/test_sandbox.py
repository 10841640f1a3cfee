"""Adversarial tests for roll.envs.tool_use.sandbox.run_python: each attack is contained, reported,
bounded in time, and leaves no process behind."""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path

import pytest

from roll.envs.tool_use.sandbox import GRACE_S, namespace_prefix, run_python

WALL = 2.0


def processes_with(marker: str) -> list[int]:
    """PIDs whose command line contains ``marker`` (read from /proc; excludes this process)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(int(entry.name))
    return found


def sandbox_dirs() -> set[str]:
    import tempfile

    return {p.name for p in Path(tempfile.gettempdir()).glob("roll-sandbox-*")}


def test_plain_code_runs_in_private_dir_with_clean_env(monkeypatch):
    monkeypatch.setenv("ROLL_TEST_SECRET", "hunter2")
    before = sandbox_dirs()
    code = "import os\nprint(6 * 7)\nprint(sorted(os.environ))\nprint(os.listdir('.'))\nprint(os.getcwd())"
    result = run_python(code, wall_timeout_s=WALL)
    assert result.ok and result.error is None and result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0] == "42"
    assert "ROLL_TEST_SECRET" not in result.stdout and "hunter2" not in result.stdout
    assert lines[1] == "['HOME', 'LANG', 'LC_ALL', 'PATH', 'TMPDIR']"
    assert lines[2] == "[]"
    assert not os.path.exists(lines[3])  # the private directory is removed afterwards
    assert sandbox_dirs() == before


def test_reading_callers_environment_through_proc_is_blocked(monkeypatch):
    monkeypatch.setenv("ROLL_TEST_SECRET", "hunter2")
    code = f"print(open('/proc/{os.getpid()}/environ').read())"
    result = run_python(code, wall_timeout_s=WALL)
    assert not result.ok and result.error.startswith("blocked: reading another process")
    assert "hunter2" not in result.stdout + result.stderr


def test_infinite_loop_hits_wall_timeout():
    result = run_python("while True:\n    pass", wall_timeout_s=1.0, cpu_time_s=30)
    assert (result.ok, result.error, result.exit_code) == (False, "timeout", None)
    assert result.wall_s < 1.0 + GRACE_S


def test_cpu_time_limit():
    result = run_python("while True:\n    pass", wall_timeout_s=10.0, cpu_time_s=1)
    assert not result.ok and result.error == "cpu time limit"


def test_sleep_past_wall_timeout():
    result = run_python("import time\nprint('start', flush=True)\ntime.sleep(60)", wall_timeout_s=1.0)
    assert result.error == "timeout" and result.stdout == "start\n"
    assert result.wall_s < 1.0 + GRACE_S


@pytest.mark.parametrize(
    "code",
    ["x = bytearray(4 * 1024 ** 3)", "chunks = []\nwhile True:\n    chunks.append(bytearray(10 ** 7))"],
)
def test_memory_bomb(code):
    result = run_python(code, wall_timeout_s=5.0, memory_mb=256)
    assert not result.ok and result.error == "memory limit"


def test_huge_output_is_capped_and_killed():
    result = run_python("while True:\n    print('y' * 1000)", wall_timeout_s=5.0, max_output_bytes=5000)
    assert result.error == "output truncated" and result.exit_code is None
    assert len(result.stdout.encode()) + len(result.stderr.encode()) <= 5000
    assert result.stdout.startswith("y" * 1000 + "\n")
    assert result.wall_s < 5.0


@pytest.mark.parametrize(
    "code",
    [
        "open(TARGET, 'w').write('x')",
        "import os\nos.close(os.open(TARGET, os.O_WRONLY | os.O_CREAT))",
        "import pathlib\npathlib.Path(TARGET).write_text('x')",
        "open('inside.txt', 'w').write('x')\nimport os\nos.rename('inside.txt', TARGET)",
        "import os\nos.symlink(TARGET, 'link')\nopen('link', 'w').write('x')",
        "import os\nos.chdir('/tmp')\nopen(os.path.basename(TARGET), 'w').write('x')",
    ],
)
def test_writing_outside_the_sandbox_is_blocked(tmp_path, code):
    target = tmp_path / f"escape-{uuid.uuid4().hex}.txt"
    result = run_python(f"TARGET = {str(target)!r}\n" + code, wall_timeout_s=WALL)
    # refused by the write rule, or earlier: a symlink out of the sandbox, a chdir out of it
    assert not result.ok and result.error.startswith(
        (
            "blocked: write outside the sandbox directory",
            "blocked: symlink to a path outside the sandbox",
            "blocked: changing directory outside the sandbox",
        )
    )
    assert not target.exists()


def test_removing_outside_files_is_blocked(tmp_path):
    victim = tmp_path / "keep.txt"
    victim.write_text("precious")
    result = run_python(f"import os\nos.remove({str(victim)!r})", wall_timeout_s=WALL)
    assert result.error.startswith("blocked: write outside") and victim.read_text() == "precious"


def test_writing_inside_the_sandbox_works():
    code = (
        "import os, tempfile\nos.mkdir('d')\nopen('d/f.txt', 'w').write('ok')\n"
        "with tempfile.NamedTemporaryFile('w', delete=False) as f:\n    f.write('t')\n"
        "os.rename('d/f.txt', 'g.txt')\nprint(open('g.txt').read(), sorted(os.listdir('.'))[:2])"
    )
    result = run_python(code, wall_timeout_s=WALL)
    assert result.ok, result.stderr
    assert result.stdout.startswith("ok ['d', 'g.txt']")


@pytest.mark.parametrize(
    "code",
    [
        "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)",
        "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM)",
        "import urllib.request\nurllib.request.urlopen('http://example.com', timeout=1)",
    ],
)
def test_network_is_blocked(code):
    result = run_python(code, wall_timeout_s=WALL)
    assert not result.ok and result.error.startswith("blocked: network")


def test_ctypes_is_blocked():
    result = run_python("import ctypes", wall_timeout_s=WALL)
    assert result.error.startswith("blocked: import of 'ctypes'")
    caught = run_python("try:\n    import ctypes\nexcept ImportError:\n    print('no ctypes')", wall_timeout_s=WALL)
    assert caught.ok and caught.stdout == "no ctypes\n"


def test_raising_limits_or_signalling_the_caller_is_blocked():
    raise_limit = run_python(
        "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (100, 100))", wall_timeout_s=WALL
    )
    assert raise_limit.error == "blocked: resource.setrlimit"
    kill = run_python(f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)", wall_timeout_s=WALL)
    assert kill.error.startswith("blocked: signalling another process")


@pytest.mark.parametrize(
    "code",
    [
        "import os\nwhile True:\n    os.fork()",
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "import subprocess\nwhile True:\n    subprocess.Popen(['sleep', 'MARKER'])",
        "import sys\ndel sys.modules['_posixsubprocess']\nimport _posixsubprocess",
        "import sys\nsys.modules['_posixsubprocess'].fork_exec()",
        "import multiprocessing\nmultiprocessing.Process(target=print).start()",
        "import os\nos.system('sleep MARKER')",
    ],
)
def test_fork_bombs_and_process_creation_are_contained(code):
    marker = f"{uuid.uuid4().int % 10**6 + 10**6}.5"
    result = run_python(code.replace("MARKER", marker), wall_timeout_s=1.5)
    assert not result.ok
    assert result.error == "timeout" or result.error.startswith(("blocked: process creation", "blocked: import"))
    assert result.wall_s < 1.5 + GRACE_S
    assert processes_with(marker) == []


def test_grandchild_in_the_group_dies_with_the_sandbox():
    marker = f"{uuid.uuid4().int % 10**6 + 10**6}.25"
    code = f"import subprocess\nsubprocess.Popen(['sleep', '{marker}'])\nprint('spawned')"
    result = run_python(code, wall_timeout_s=WALL, allow_processes=True, use_namespaces=False)
    assert result.ok and result.stdout == "spawned\n"
    assert processes_with(marker) == []


def test_grandchild_in_new_session_dies_with_pid_namespace():
    if "--pid" not in namespace_prefix():
        pytest.skip("unshare --pid does not work here")
    marker = f"{uuid.uuid4().int % 10**6 + 10**6}.75"
    code = f"import subprocess, time\nsubprocess.Popen(['sleep', '{marker}'], start_new_session=True)\ntime.sleep(30)"
    result = run_python(code, wall_timeout_s=1.0, allow_processes=True)
    assert result.error == "timeout"
    assert processes_with(marker) == []


def test_uncaught_exception_and_exit_codes():
    result = run_python("print('a')\n1 / 0", wall_timeout_s=WALL)
    assert (result.ok, result.stdout, result.exit_code) == (False, "a\n", 1)
    assert result.error == "ZeroDivisionError: division by zero"
    assert "_bootstrap" not in result.stderr  # only the user's frames are shown
    assert run_python("import sys\nsys.exit(3)", wall_timeout_s=WALL).error == "exit code 3"
    assert run_python("def (", wall_timeout_s=WALL).error == "SyntaxError: invalid syntax"


def test_concurrent_calls_from_threads():
    results = {}

    def work(i: int) -> None:
        results[i] = run_python(f"print({i} ** 2)", wall_timeout_s=5.0)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {i: r.stdout for i, r in results.items()} == {i: f"{i * i}\n" for i in range(4)}


def test_bad_limits_are_rejected():
    with pytest.raises(ValueError, match="wall_timeout_s=0"):
        run_python("pass", wall_timeout_s=0)


@pytest.mark.parametrize(
    "code",
    [
        "import os\nfd = os.open(DIR, os.O_RDONLY)\nos.close(os.open('x', os.O_WRONLY | os.O_CREAT, dir_fd=fd))",
        "open('evil.cpython-311-x86_64-linux-gnu.so', 'wb').write(b'ELF')",
    ],
)
def test_dir_fd_escape_and_native_module_writes_are_blocked(tmp_path, code):
    result = run_python(f"DIR = {str(tmp_path)!r}\n" + code, wall_timeout_s=WALL)
    assert not result.ok and result.error.startswith("blocked: ")
    assert list(tmp_path.iterdir()) == []
