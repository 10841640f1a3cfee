"""No silent hang at start: DeepSpeed on CPU builds nothing, stale torch build locks are found and reported, and a
slow worker start is announced and times out with a message. Every test uses its own TORCH_EXTENSIONS_DIR (never
the shared ~/.cache/torch_extensions)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roll.distributed.group import free_port, start_notice
from roll.launch import doctor
from roll.strategies.build_locks import SHM_COMM_OP, extensions_root, find_build_locks

REPO = Path(__file__).resolve().parents[2]


def stale_lock(root: Path, name: str = SHM_COMM_OP) -> Path:
    """The lock file a build killed mid-way leaves: ``<root>/<name>/lock``, held by nobody."""
    (root / name).mkdir(parents=True, exist_ok=True)
    lock = root / name / "lock"
    lock.touch()
    return lock


def test_extensions_root_follows_torch_extensions_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert extensions_root() == tmp_path
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert extensions_root() == tmp_path / "cache" / "torch_extensions"


def test_lock_left_by_a_killed_build_is_stale_with_the_command_that_removes_it(tmp_path):
    lock = stale_lock(tmp_path / "py311_cpu")  # the default root has a python/accelerator folder
    [found] = find_build_locks(tmp_path)
    assert found.path == lock and found.stale and found.holders == ()
    assert f"rm {lock}" in found.message() and SHM_COMM_OP in found.message()


def test_lock_held_open_by_a_live_builder_is_not_stale(tmp_path):
    lock = stale_lock(tmp_path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); print('open', flush=True); time.sleep(60)",
            str(lock),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "open"
        [found] = find_build_locks(tmp_path)
        assert not found.stale and found.holders == (holder.pid,)
        assert f"pid {holder.pid}" in found.message()
    finally:
        holder.kill()
        holder.wait()
    assert find_build_locks(tmp_path)[0].stale  # the builder is gone: now the lock is stale


def test_process_working_in_the_build_directory_holds_the_lock(tmp_path):
    """ninja and the compiler run in the build directory without the lock open."""
    lock = stale_lock(tmp_path)
    compiler = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=lock.parent)
    try:
        assert find_build_locks(tmp_path)[0].holders == (compiler.pid,)
    finally:
        compiler.kill()
        compiler.wait()


@pytest.mark.parametrize("holds_by", ["cwd", "fd"])
def test_a_file_closed_between_listing_and_reading_does_not_hide_the_holder(tmp_path, monkeypatch, holds_by):
    """A busy builder opens and closes files all the time: an fd gone between ``/proc/<pid>/fd`` and its readlink
    (the race that failed CI once) must not drop the process from the holders."""
    lock = stale_lock(tmp_path / "ext")
    entry = tmp_path / "proc" / "4242"
    (entry / "fd").mkdir(parents=True)
    (entry / "cwd").symlink_to(lock.parent if holds_by == "cwd" else tmp_path)
    (entry / "fd" / "3").symlink_to(tmp_path / "closed-meanwhile")
    if holds_by == "fd":
        (entry / "fd" / "4").symlink_to(lock.resolve())
    real_readlink = os.readlink

    def readlink(path):
        if Path(path).name == "3":
            raise FileNotFoundError(path)
        return real_readlink(path)

    monkeypatch.setattr("roll.strategies.build_locks.os.readlink", readlink)
    [found] = find_build_locks(tmp_path / "ext", proc=tmp_path / "proc")
    assert found.holders == (4242,) and not found.stale


def test_doctor_reports_a_stale_lock_with_its_fix_and_passes_without_one(tmp_path):
    [ok] = doctor.check_build_locks(tmp_path)
    assert ok.status is doctor.Status.OK
    lock = stale_lock(tmp_path)
    [row] = doctor.check_build_locks(tmp_path)
    assert row.status.failed and row.fix == f"rm {lock}" and row.found == str(lock)
    assert doctor.exit_code([row]) == 1


@pytest.mark.slow  # two DeepSpeed starts and train steps in a fresh interpreter
def test_deepspeed_start_on_cpu_proceeds_past_a_stale_lock_and_builds_nothing(tmp_path, tiny_model_dir):
    """The hang of issue 19: a stale ``deepspeed_shm_comm/lock`` made every later DeepSpeed start wait forever.
    Now a full DeepSpeedTrainStrategy start and train step (ZeRO 0 and 3) finish, with one warning line naming the
    lock, and nothing is built."""
    root = tmp_path / "ext"
    lock = stale_lock(root)
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(root)}
    start = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "tests" / "config" / "ds_fragment_worker.py"),
            tiny_model_dir,
            str(free_port()),
            "deepspeed_zero,deepspeed_zero3",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [line.split()[:3] for line in proc.stdout.splitlines() if line.startswith("RESULT")] == [
        ["RESULT", "deepspeed_zero", "1"],
        ["RESULT", "deepspeed_zero3", "1"],
    ]
    assert time.monotonic() - start < 120
    assert f"rm {lock}" in proc.stderr
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == [SHM_COMM_OP, f"{SHM_COMM_OP}/lock"]


def test_start_notice_announces_a_slow_start_and_names_a_stale_lock(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = stale_lock(tmp_path)
    err, deadline = "", time.monotonic() + 60
    with start_notice("actor_train", timeout_s=600, every_s=0.1):
        while err.count("\n") < 3 and time.monotonic() < deadline:  # three notices, however loaded the machine
            time.sleep(0.05)
            err += capsys.readouterr().err
    err += capsys.readouterr().err
    time.sleep(0.3)
    assert capsys.readouterr().err == ""  # the watcher has stopped: no line once the start is over
    lines = err.splitlines()
    assert len(lines) >= 3
    assert all(line.startswith("[roll] actor_train: workers still starting after") for line in lines)
    assert f"rm {lock}" in lines[0]


def test_start_timeout_names_the_role_and_the_limit():
    with pytest.raises(TimeoutError, match=r"actor_infer: workers did not start within rpc_timeout=30 s"):
        with start_notice("actor_infer", timeout_s=30):
            raise TimeoutError("Get timed out: some object(s) not ready.")
