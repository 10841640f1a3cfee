"""The house's import rules, read from the source (every import, module level or inside a function):
no import cycles between roll's files, ``roll/config`` imports nothing of roll but itself, ``roll.data`` and the
shared ``roll.registry``, ``roll/envs`` never imports torch, ``roll/algorithms`` never imports Ray or a backend."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, Path]:
    out = {}
    for path in (ROOT / "roll").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def imports(path: Path) -> set[str]:
    """Every module named by an ``import`` / ``from ... import`` anywhere in the file (absolute imports)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


GRAPH = {m: {d for d in imports(p) if d in MODULES and d != m} for m, p in MODULES.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles_between_roll_files():
    assert cycles(GRAPH) == []


def _package(module: str) -> str:
    return module.split(".")[1] if module.count(".") else module


def test_config_imports_nothing_above_it():
    allowed = {"config", "data", "registry"}
    bad = {
        m: sorted(d for d in deps if _package(d) not in allowed) for m, deps in GRAPH.items() if _package(m) == "config"
    }
    assert {m: d for m, d in bad.items() if d} == {}


def test_envs_never_import_torch_and_algorithms_never_import_ray_or_backends():
    for module, path in MODULES.items():
        names = {n.split(".")[0] for n in imports(path)}
        if _package(module) == "envs":
            assert "torch" not in names, module
        if _package(module) == "algorithms":
            assert not names & {"ray", "deepspeed", "sglang", "transformers"}, module
            assert not {_package(d) for d in GRAPH[module]} - {"algorithms", "registry"}, module


#: The house's floors, top to bottom: a module imports only from its own package or a package on a lower floor.
FLOORS = [
    "__main__",
    "pipelines",  # orchestration: the agentic and RLVR pipelines, checkpoints, the SFT warm start
    "launch",  # starting a run: command line, preflight, doctor, the roles' startup
    "ppo",  # the PPO update both pipelines share
    "agentic",  # env managers, chat, the scheduler, the gateway
    "rollout",  # generation clients, the dynamic batcher, the asynchronous group buffer
    "distributed",  # Ray, worker groups, typed role proxies, placement
    "strategies",  # one interface over the backends
    "weights",  # weights from trainer to engines: buckets, IPC, shared memory, the weight group, the sync
    "models",
    "envs",
    "rewards",
    "tracking",
    "algorithms",
    "calls",
    "network",  # free ports and this node's address
    "data",
    "config",
    "registry",
    "errors",
    "roll",  # roll/__init__.py
]
#: Imports that still run up a floor, to be removed (never added to).
UPWARD_KNOWN: set[tuple[str, str]] = set()


def upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """``(module, imported)`` pairs whose imported module's package sits on a higher floor than the module's."""
    out = set()
    for module, deps in graph.items():
        for dep in deps:
            a, b = _package(module), _package(dep)
            if a != b and FLOORS.index(b) < FLOORS.index(a):
                out.add((module, dep))
    return out


def test_upward_import_finder_finds_one():
    assert upward_imports({"roll.envs.x": {"roll.pipelines.y"}, "roll.pipelines.y": {"roll.envs.x"}}) == {
        ("roll.envs.x", "roll.pipelines.y")
    }


def test_every_package_has_a_floor():
    assert {_package(m) for m in GRAPH} - set(FLOORS) == set()


def test_imports_only_go_down_a_floor():
    assert upward_imports(GRAPH) - UPWARD_KNOWN == set()
    assert UPWARD_KNOWN - upward_imports(GRAPH) == set(), "an upward import was removed: drop it from UPWARD_KNOWN"
