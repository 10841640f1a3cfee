"""Shared test setup: offline, quiet environment variables, one torch thread, one tiny model per test session, a
Ray instance per module that asks for it, and a headless browser for the viewer's tests."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
# One intra-op thread for torch, here and in the processes the tests start (they inherit it): the tests' models are
# tiny, where a second thread costs more than it gives (tests/models ran 4x slower with 2 on a loaded 2-core machine),
# and a fixed count makes a run independent of the machine's cores. Workers still set their own (num_cpus_per_worker);
# OMP_NUM_THREADS=n python -m pytest runs the suite with n.
os.environ.setdefault("OMP_NUM_THREADS", "1")
if importlib.util.find_spec("torch") is not None:
    __import__("torch").set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # also if a plugin imported torch first
if importlib.util.find_spec("torch") is None or not __import__("torch").cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # on a GPU machine DeepSpeed picks CUDA (GPU-only tests)

TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    seed=0,
)


@pytest.fixture(scope="module")
def ray_session():
    """A new local Ray instance (2 CPUs, no dashboard) whose workers import this repository, shut down after the
    module; ``address="local"``: never another run's Ray that is up on this machine (without it, ``ray.init`` joins
    the newest one and refuses ``num_cpus``)."""
    ray = pytest.importorskip("ray")
    pythonpath = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")]))
    if ray.is_initialized():  # an in-process pipeline run of an earlier module (Ray mode) left its instance up
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def dist_env():
    """The environment of a one-rank torch.distributed job on this machine (a free port; DeepSpeed on CPU), for tests
    that build a training strategy in-process; variables already set are kept."""
    from roll.distributed.group import free_port

    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "DS_ACCELERATOR": "cpu",
    }
    for k, v in env.items():
        os.environ.setdefault(k, v)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A tiny Qwen2 model + local tokenizer saved as a Hugging Face directory (built once per session)."""
    from roll.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen2", **TINY))


# ------------------------------------------------------------------------------------------------ a real browser
BROWSER_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[1] / "output" / "test-artifacts"


def find_chromium() -> str | None:
    """The OS's Chromium (``ROLL_CHROMIUM`` overrides), or None."""
    import shutil

    if os.environ.get("ROLL_CHROMIUM"):
        return os.environ["ROLL_CHROMIUM"]
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


@pytest.fixture(scope="module")
def browser_context(tmp_path_factory):
    """A headless Chromium (Debian's package) driven by Playwright; skips where either is missing. Module-scoped:
    Playwright's sync API keeps an event loop running in this thread while it is up, and a later test of another
    module that runs its own loop would fail ("Cannot run the event loop while another loop is running")."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed: pip install -e '.[view]' (CI installs it)")
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("no Chromium found: apt-get install chromium (or set ROLL_CHROMIUM); CI installs it")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=chromium,
            headless=True,
            args=BROWSER_ARGS,
            viewport={"width": 1300, "height": 900},
        )
        yield context
        context.close()


@pytest.fixture
def open_page(browser_context):
    """``open_page(path_or_url)`` -> a Playwright page at that file; the test fails on any page error."""
    pages, errors = [], []

    def open_(target) -> Any:
        page = browser_context.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.goto(Path(target).resolve().as_uri() if not str(target).startswith("file:") else str(target))
        pages.append(page)
        return page

    yield open_
    for page in pages:
        page.close()
    assert not errors, f"errors in the page: {errors}"


@pytest.fixture(scope="session")
def screenshot():
    """``screenshot(page, name)`` saves a PNG of the page as ``output/test-artifacts/<name>.png`` (test artifacts
    for people to look at; git-ignored) and returns its path."""

    def save(page, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return save


@pytest.fixture(scope="session")
def tiny_vl_model_dir(tmp_path_factory) -> str:
    """A tiny Qwen2.5-VL-architecture model (vision tower, image processor, image tokens) built once per session."""
    from roll.models.tiny import env_corpus
    from roll.models.tiny_vl import build_tiny_vl_model

    path = tmp_path_factory.mktemp("models") / "tiny-qwen2.5-vl"
    return str(build_tiny_vl_model(path, **TINY, vision_hidden_size=32, corpus=env_corpus(episodes_per_env=8)))
