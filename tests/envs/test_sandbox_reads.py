"""Adversarial reads against the tool sandbox (issue 19): each attack is refused by the kernel layer (Landlock)
alone, by the audit hook alone (the fallback where the kernel has no Landlock), and by both together (the
default), and nothing of the secret reaches the output. What the standard library needs still works."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from roll.envs.tool_use import sandbox
from roll.envs.tool_use.sandbox import interpreter, landlock_abi, run_python, sandbox_paths

REPO = Path(__file__).resolve().parents[2]
HOME = Path.home()
SECRET = "hunter2-roll-sandbox-secret"
WALL = 5.0
needs_landlock = pytest.mark.skipif(landlock_abi() < 1, reason="the kernel offers no Landlock here")

ATTACKS = {
    "open": "print(open(SECRET).read())",
    "io.open_code": "import io\nprint(io.open_code(SECRET).read())",
    "os.open": "import os\nprint(os.read(os.open(SECRET, os.O_RDONLY), 100))",
    "pathlib": "import pathlib\nprint(pathlib.Path(SECRET).read_text())",
    "shutil.copyfile": "import shutil\nshutil.copyfile(SECRET, 'copy')\nprint(open('copy').read())",
    "linecache": "import linecache\nprint(linecache.getline(SECRET, 1) or NOTHING)",
    "symlink": "import os\nos.symlink(SECRET, 'link')\nprint(open('link').read())",
    "hard link": "import os\nos.link(SECRET, 'link')\nprint(open('link').read())",
    "dotdot": "print(open('../' * 30 + SECRET.lstrip('/')).read())",
    "proc self root": "print(open('/proc/self/root' + SECRET).read())",
    "listdir secret dir": "import os\nprint(os.listdir(SECRET_DIR))",
    "scandir secret dir": "import os\nprint([e.name for e in os.scandir(SECRET_DIR)])",
    "pathlib iterdir": "import pathlib\nprint(list(pathlib.Path(SECRET_DIR).iterdir()))",
    "glob": "import glob\nprint(glob.glob(SECRET_DIR + '/*') or NOTHING)",
    "dir fd climb": (
        "import os\nbase = os.open('.', os.O_RDONLY)\nos.makedirs('a/' * 40)\nos.chdir('a/' * 40)\n"
        "fd = os.open('../' * 40 + SECRET_FROM_WORK, os.O_RDONLY, dir_fd=base)\nprint(os.read(fd, 100))"
    ),
    "sqlite uri": (
        "import sqlite3\nsqlite3.connect('file:' + SECRET + '?mode=ro', uri=True).execute('select 1')\n"
        "print('connected')"
    ),
    "readline history": ("import readline\nreadline.read_history_file(SECRET)\nprint(readline.get_history_item(1))"),
    "descriptor passed in": (
        "import os\nfor fd in range(3, 64):\n    try:\n        print(os.read(fd, 100))\n"
        "    except OSError:\n        pass\nraise SystemExit(5)"
    ),
}
"""Code that tries to print the secret file's content (or list its directory) from the sandbox. Library calls that
swallow the refusal (``glob``, ``linecache``) print ``NOTHING`` instead."""
NOTHING = "nothing-came-back"

HOST_TARGETS = {
    "/etc/passwd": "print(open('/etc/passwd').read())",
    "listing /etc": "import os\nprint(os.listdir('/etc'))",
    "pwd database": "import pwd\nprint(pwd.getpwall())",
    "home listing": f"import os\nprint(os.listdir({str(HOME)!r}))",
    "project file": f"print(open({str(REPO / 'README.md')!r}).read())",
    "project listing": f"import os\nprint(os.listdir({str(REPO)!r}))",
    "caller's /proc environ": f"print(open('/proc/{os.getpid()}/environ').read())",
    "caller's /proc cmdline": f"print(open('/proc/{os.getpid()}/cmdline').read())",
    "pid 1 /proc": "print(open('/proc/1/status').read())",
    "listing /proc": "import os\nprint([p for p in os.listdir('/proc') if p.isdigit()])",
}
"""Reads of real host files: the user's home, the project, /etc, other processes."""


@pytest.fixture
def secret_file(tmp_path) -> Path:
    secret_dir = tmp_path / "secret-dir"
    secret_dir.mkdir()
    path = secret_dir / "credentials"
    path.write_text(SECRET + "\n")
    return path


def preamble(secret: Path, work: Path | None = None) -> str:
    lines = [f"SECRET = {str(secret)!r}", f"SECRET_DIR = {str(secret.parent)!r}", f"NOTHING = {NOTHING!r}"]
    if work is not None:  # the secret as a path relative to the filesystem root, reached from work
        lines.append(f"SECRET_FROM_WORK = {os.path.relpath(secret, '/')!r}")
    return "\n".join(lines) + "\n"


def kernel_only(code: str, tmp_path: Path, *, passed_fd: int | None = None) -> subprocess.CompletedProcess:
    """``code`` under the sandbox's Landlock rules and nothing else (no audit hook, plain ``python -I -S``)."""
    root = tmp_path / "sandbox-root"
    work = root / "work"
    work.mkdir(parents=True)
    rules = sandbox_paths(str(root), str(work))
    return subprocess.run(
        [interpreter(), "-I", "-S", sandbox._LANDLOCK, json.dumps(rules), "--", interpreter(), "-I", "-S", "-c", code],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "HOME": str(work)},
        pass_fds=() if passed_fd is None else (passed_fd,),
    )


def assert_no_leak(text: str, secret: str = SECRET) -> None:
    assert secret not in text


def refused(ok: bool, stdout: str) -> bool:
    """The attack failed: an error, or a library call that swallowed the refusal came back empty."""
    return not ok or stdout.strip() == NOTHING


def host_secret(name: str) -> str:
    """A line of the host file that ``HOST_TARGETS[name]`` reads, that must not appear in the output."""
    if name == "/etc/passwd":
        return Path("/etc/passwd").read_text().splitlines()[0]
    if name == "project file":
        return "roll"
    if name.startswith("caller's"):
        return Path(f"/proc/{os.getpid()}/cmdline").read_bytes().split(b"\0")[0].decode()
    if name == "listing /proc":
        return f"'{os.getpid()}'"
    if name == "home listing":
        return next((f"'{p.name}'" for p in sorted(HOME.iterdir())), "nothing-in-home")
    if name == "project listing":
        return "'roll'"
    if name == "pid 1 /proc":
        return "PPid"
    return "root:"


# ------------------------------------------------------------------ both layers (the default)


@pytest.mark.parametrize("name", ATTACKS)
def test_secret_reads_are_refused(name, secret_file, tmp_path):
    code = preamble(secret_file, tmp_path) + ATTACKS[name]
    if name == "descriptor passed in":  # a descriptor the caller holds open must not reach the code
        fd = os.open(secret_file, os.O_RDONLY)
        os.set_inheritable(fd, True)
        try:
            result = run_python(code, wall_timeout_s=WALL)
        finally:
            os.close(fd)
        assert result.exit_code == 5 and result.stdout == ""
        return
    result = run_python(code, wall_timeout_s=WALL)
    assert refused(result.ok, result.stdout), (name, result)
    assert_no_leak(result.stdout + result.stderr)
    assert "credentials" not in result.stdout


@pytest.mark.parametrize("name", HOST_TARGETS)
def test_host_reads_are_refused(name):
    result = run_python(HOST_TARGETS[name], wall_timeout_s=WALL)
    assert not result.ok and result.error.startswith("blocked: "), (name, result.error)
    assert_no_leak(result.stdout + result.stderr, host_secret(name))


# ------------------------------------------------------------------ the audit hook alone (no Landlock)


@pytest.mark.parametrize("name", [n for n in ATTACKS if n != "descriptor passed in"])
def test_audit_hook_alone_refuses_secret_reads(name, secret_file, tmp_path):
    result = run_python(preamble(secret_file, tmp_path) + ATTACKS[name], wall_timeout_s=WALL, use_landlock=False)
    assert result.stdout.strip() == NOTHING or result.error.startswith("blocked: "), (name, result.error)
    assert_no_leak(result.stdout + result.stderr)


@pytest.mark.parametrize("name", HOST_TARGETS)
def test_audit_hook_alone_refuses_host_reads(name):
    result = run_python(HOST_TARGETS[name], wall_timeout_s=WALL, use_landlock=False)
    assert not result.ok and result.error.startswith("blocked: "), (name, result.error)
    assert_no_leak(result.stdout + result.stderr, host_secret(name))


def test_audit_hook_alone_closes_descriptors_passed_in(secret_file):
    fd = os.open(secret_file, os.O_RDONLY)
    os.set_inheritable(fd, True)
    try:
        result = run_python(ATTACKS["descriptor passed in"], wall_timeout_s=WALL, use_landlock=False)
    finally:
        os.close(fd)
    assert result.exit_code == 5 and result.stdout == ""


# ------------------------------------------------------------------ the kernel layer alone


@needs_landlock
@pytest.mark.parametrize("name", [n for n in ATTACKS if n != "descriptor passed in"])
def test_landlock_alone_refuses_secret_reads(name, secret_file, tmp_path):
    """Plain Python (no hook) under the rules: the kernel refuses (EACCES; EXDEV for a hard link out of the
    sandbox; sqlite's 'unable to open'); nothing of the secret or its directory comes back."""
    done = kernel_only(preamble(secret_file, tmp_path) + ATTACKS[name], tmp_path)
    assert refused(done.returncode == 0, done.stdout), (name, done.stdout)
    assert_no_leak(done.stdout + done.stderr)
    assert "credentials" not in done.stdout
    if done.returncode:
        assert any(e in done.stderr for e in ("PermissionError", "cross-device link", "unable to open")), done.stderr


@needs_landlock
@pytest.mark.parametrize("name", [n for n in HOST_TARGETS if n != "pwd database"])
def test_landlock_alone_refuses_host_reads(name, tmp_path):
    done = kernel_only(HOST_TARGETS[name], tmp_path)
    assert done.returncode != 0 and "PermissionError" in done.stderr, (name, done.stderr[-500:])
    assert_no_leak(done.stdout + done.stderr, host_secret(name))


@needs_landlock
def test_landlock_alone_leaves_the_password_database_empty(tmp_path):
    done = kernel_only("import pwd\nprint(len(pwd.getpwall()))", tmp_path)
    assert done.stdout.strip() == "0", done.stderr


@needs_landlock
def test_landlock_alone_refuses_writes_network_and_signals(tmp_path):
    target = tmp_path / "escape.txt"
    code = (
        f"import os, socket\nfor attempt in (lambda: open({str(target)!r}, 'w'),\n"
        "                lambda: socket.create_connection(('127.0.0.1', 22), timeout=1),\n"
        f"                lambda: os.kill({os.getpid()}, 0)):\n"
        "    try:\n        attempt()\n        print('allowed')\n    except OSError as exc:\n"
        "        print(type(exc).__name__)"
    )
    done = kernel_only(code, tmp_path)
    assert done.stdout.split() == ["PermissionError"] * 3, done.stderr
    assert not target.exists()


# ------------------------------------------------------------------ what the standard library needs still works


STDLIB_USE = """\
import datetime, decimal, fractions, hashlib, inspect, json, math, os, random, re, shutil, sqlite3, statistics
import tempfile, time, zoneinfo
print(len(inspect.getsource(json)) > 1000, math.factorial(20), os.urandom(4).__len__(), random.random() < 1)
print(time.localtime().tm_year > 2000, datetime.datetime.now(zoneinfo.ZoneInfo('UTC')).year > 2000)
with tempfile.TemporaryDirectory() as d:
    open(os.path.join(d, 'x'), 'w').write('y')
    os.makedirs(os.path.join(d, 'a', 'b'))
print(os.path.exists(d), sqlite3.connect(':memory:').execute('select 2 + 3').fetchone()[0])
with open(os.devnull, 'w') as f:
    f.write('discarded')
os.makedirs('out/deep'); open('out/deep/f.txt', 'w').write('kept'); shutil.copytree('out', 'out2')
print(sorted(os.listdir('.')), open('out2/deep/f.txt').read(), hashlib.sha256(b'').hexdigest()[:8])
print(statistics.mean([1, 2, 3]), decimal.Decimal(1) / 7 > 0, fractions.Fraction(1, 3) * 3)
"""
STDLIB_EXPECTED = [
    "True 2432902008176640000 4 True",
    "True True",
    "False 5",
    "['out', 'out2'] kept e3b0c442",
    "2 True 1",
]


@pytest.mark.parametrize("use_landlock", [True, False])
def test_standard_library_still_works(use_landlock):
    result = run_python(STDLIB_USE, wall_timeout_s=10.0, use_landlock=use_landlock)
    assert result.ok, result.stderr
    assert result.stdout.splitlines() == STDLIB_EXPECTED


@needs_landlock
def test_standard_library_works_under_landlock_alone(tmp_path):
    done = kernel_only(STDLIB_USE, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == STDLIB_EXPECTED


def test_missing_landlock_is_announced_once(monkeypatch, capsys):
    """Where the kernel has no Landlock the fallback is said in one loud line, once per process."""
    monkeypatch.setattr(sandbox, "_LANDLOCK", "/nonexistent/_landlock.py")
    sandbox.landlock_abi.cache_clear()
    try:
        assert landlock_abi() == 0 and landlock_abi() == 0
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("[roll] WARNING: tool sandbox: this kernel offers no Landlock")
        result = run_python("print(1)\nprint(open('/etc/passwd').read())", wall_timeout_s=WALL)
        assert result.error == "blocked: reading outside the sandbox ('/etc/passwd')" and result.stdout == "1\n"
    finally:
        sandbox.landlock_abi.cache_clear()
