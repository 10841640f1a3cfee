"""Tests of ``roll doctor``: requirement rows, known-bad rules, config requirements, report and exit codes."""

from __future__ import annotations

import copy
import importlib.metadata
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from roll.launch import cli, doctor
from roll.launch.doctor import CheckResult, GpuInfo, RollRequirements, Status
from tests.config_cache import cached_config

REPO = Path(__file__).resolve().parents[1]
NO_SUCH = "roll-doctor-no-such-package"
PYTEST_VERSION = importlib.metadata.version("pytest")


def worker(strategy: str, devices: list[int] | None = None) -> SimpleNamespace:
    """A worker block as the config loader returns it (the attributes the doctor reads)."""
    return SimpleNamespace(strategy_args=SimpleNamespace(strategy_name=strategy), device_mapping=devices or [])


def fake_config(
    train: str = "deepspeed_train",
    infer: str = "hf_infer",
    devices: list[int] | None = None,
    track_with: str | list[str] = "stdout",
    num_gpus_per_node: int = 0,
    **extra,
) -> SimpleNamespace:
    return SimpleNamespace(
        actor_train=worker(train, devices),
        actor_infer=worker(infer, devices),
        reference=None,
        num_gpus_per_node=num_gpus_per_node,
        track_with=track_with,
        **extra,
    )


def reqs(*required: str, optional: tuple[str, ...] = (), python: str = ">=3.10") -> RollRequirements:
    return RollRequirements(
        SpecifierSet(python), tuple(map(Requirement, required)), tuple(map(Requirement, optional)), "test"
    )


def by_name(results: list[CheckResult]) -> dict[str, CheckResult]:
    return {r.name: r for r in results}


# ------------------------------------------------------------------ single requirements


def test_missing_package_reported_with_fix_command():
    result = doctor.check_requirement(Requirement(f"{NO_SUCH}>=1.2"), doctor.installed_version(NO_SUCH))
    assert result.status is Status.MISSING and result.found is None
    assert result.fix == f"pip install '{NO_SUCH}>=1.2'"
    assert doctor.exit_code([result]) == 1


def test_optional_missing_does_not_fail():
    result = doctor.check_requirement(Requirement(NO_SUCH), None, optional=True)
    assert result.status is Status.OPTIONAL_MISSING and result.required == "any"
    assert result.fix == f"pip install {NO_SUCH}"
    assert doctor.exit_code([result]) == 0


def test_too_old_and_too_new():
    old = doctor.check_requirement(Requirement("pytest>=999"), PYTEST_VERSION)
    assert (old.status, old.found, old.fix) == (Status.TOO_OLD, PYTEST_VERSION, "pip install 'pytest>=999'")
    new = doctor.check_requirement(Requirement("pytest<1"), PYTEST_VERSION)
    assert (new.status, new.fix) == (Status.TOO_NEW, "pip install 'pytest<1'")
    assert doctor.check_requirement(Requirement("omegaconf>=2.2,<2.4"), "2.4.0").status is Status.TOO_NEW
    assert doctor.check_requirement(Requirement("omegaconf>=2.2,<2.4"), "2.1.0").status is Status.TOO_OLD
    assert doctor.check_requirement(Requirement("pytest>=1"), PYTEST_VERSION).status is Status.OK


def test_torch_fix_depends_on_gpu_machine():
    cpu = doctor.check_requirement(Requirement("torch>=2.4"), None, gpu_machine=False)
    assert cpu.fix == "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
    gpu = doctor.check_requirement(Requirement("torch>=2.4"), "2.3.1", gpu_machine=True)
    assert gpu.status is Status.TOO_OLD and gpu.fix == "pip install torch==2.13.0"
    assert "download.pytorch.org/whl/cu" in gpu.note
    # A specifier that excludes the tested torch is installed as written.
    assert doctor.torch_fix(SpecifierSet(">=2.14"), False)[0].startswith("pip install 'torch>=2.14' --index-url")


def test_torch_local_version_matches():
    assert doctor.check_requirement(Requirement("torch>=2.4"), "2.13.0+cpu").status is Status.OK


def test_sglang_fix_installs_gpu_extra_and_warns_about_torch():
    result = doctor.check_requirement(Requirement("sglang>=0.5.16"), None, optional=True)
    assert result.fix == "pip install 'roll[gpu]'"
    assert "pins exact torch" in result.note


def test_python_check():
    assert doctor.check_python(SpecifierSet(">=3.10"), "3.11.7").status is Status.OK
    old = doctor.check_python(SpecifierSet(">=3.10"), "3.9.1")
    assert old.status is Status.TOO_OLD and "python3.11 -m venv" in old.fix


# ------------------------------------------------------------------ known-bad rules


def test_known_bad_hydra_antlr():
    bad = doctor.check_known_bad({"hydra-core": "1.3.2", "antlr4-python3-runtime": "4.11.1"})
    assert [(r.name, r.status, r.fix) for r in bad] == [
        ("hydra-core + antlr4-python3-runtime", Status.KNOWN_BAD, "pip install 'antlr4-python3-runtime==4.9.3'")
    ]
    assert bad[0].found == "hydra-core 1.3.2, antlr4-python3-runtime 4.11.1" and "ANTLR 4.9" in bad[0].note
    assert doctor.check_known_bad({"hydra-core": "1.3.2", "antlr4-python3-runtime": "4.9.3"}) == []
    assert doctor.check_known_bad({"hydra-core": "1.4.0", "antlr4-python3-runtime": "4.11.1"}) == []


def test_known_bad_omegaconf_with_hydra_13():
    bad = doctor.check_known_bad({"hydra-core": "1.3.8", "omegaconf": "2.4.0", "antlr4-python3-runtime": "4.9.3"})
    assert [r.name for r in bad] == ["hydra-core + omegaconf"]
    assert doctor.check_known_bad({"hydra-core": "1.3.8", "omegaconf": "2.3.1"}) == []


def test_known_bad_sglang_pins():
    torch_bad = doctor.check_known_bad({"sglang": "0.5.16", "torch": "2.13.0+cpu", "transformers": "5.12.1"})
    assert [(r.name, r.fix) for r in torch_bad] == [("sglang + torch", "pip install torch==2.11.0")]
    both = doctor.check_known_bad({"sglang": "0.5.16", "torch": "2.10.0", "transformers": "5.23.0"})
    assert [r.name for r in both] == ["sglang + torch", "sglang + transformers"]
    assert doctor.check_known_bad({"sglang": "0.5.16", "torch": "2.11.0+cu130", "transformers": "5.12.1"}) == []
    # sglang not installed (or another release): the rules do not apply.
    assert doctor.check_known_bad({"sglang": None, "torch": "2.13.0", "transformers": "5.23.0"}) == []
    assert doctor.check_known_bad({"sglang": "0.5.23", "torch": "2.14.1", "transformers": "5.23.0"}) == []


def test_known_bad_takes_custom_rules():
    rule = doctor.KnownBadRule(when=(("a", ">=2"), ("b", "<1")), required="b>=1", reason="a 2 needs b 1", fix="fix")
    assert len(doctor.check_known_bad({"a": "2.0", "b": "0.5"}, [rule])) == 1
    assert doctor.check_known_bad({"a": "1.0", "b": "0.5"}, [rule]) == []


# ------------------------------------------------------------------ roll's requirements and the environment


def test_requirements_from_setup_cfg(tmp_path):
    cfg = tmp_path / "setup.cfg"
    cfg.write_text(
        "[options]\npython_requires = >=3.10\ninstall_requires =\n    torch>=2.4\n"
        "    pywin32>=300; sys_platform == 'nt'\n    numpy>=1.24\n"
        "[options.extras_require]\ngpu =\n    sglang>=0.5.16\ntest =\n    pytest>=8\n"
    )
    python, lines = doctor.requirements_from_setup_cfg(cfg)
    required, optional = doctor.split_requirements(lines)
    assert python == ">=3.10"
    expected_required = ["torch", "numpy"] if sys.platform != "nt" else ["torch", "pywin32", "numpy"]
    assert [r.name for r in required] == expected_required
    assert [str(r.specifier) for r in optional] == [">=0.5.16"] and optional[0].name == "sglang"


def test_missing_setup_cfg_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="pip install -e"):
        doctor.requirements_from_setup_cfg(tmp_path / "setup.cfg")


def test_roll_requirements_list_core_and_optional_backends():
    r = doctor.load_roll_requirements()
    required = {req.name for req in r.required}
    assert {"torch", "transformers", "deepspeed", "ray", "gymnasium", "hydra-core"} <= required
    optional = {req.name for req in r.optional}
    assert {"sglang", "megatron-core", "vllm"} <= optional and "pytest" not in required | optional
    assert r.python.contains("3.11")


def test_check_environment_with_fake_facts():
    versions = {
        "torch": "2.13.0+cpu",
        "pytest": PYTEST_VERSION,
        NO_SUCH: None,
        "sglang": None,
        "hydra-core": "1.3.8",
        "antlr4-python3-runtime": "4.11.1",
    }
    results = doctor.check_environment(
        reqs("torch>=2.4", "pytest>=999", f"{NO_SUCH}>=1", optional=("sglang>=0.5.16",)),
        versions=versions,
        gpu=GpuInfo(count=0, cuda=None),
        gpu_machine=False,
    )
    rows = by_name(results)
    assert [r.name for r in results][:2] == ["python", "cuda"]
    assert rows["torch"].status is Status.OK
    assert rows["pytest"].status is Status.TOO_OLD
    assert rows[NO_SUCH].status is Status.MISSING
    assert rows["sglang"].status is Status.OPTIONAL_MISSING
    assert rows["hydra-core + antlr4-python3-runtime"].status is Status.KNOWN_BAD
    assert rows["cuda"].status is Status.OPTIONAL_MISSING
    assert doctor.exit_code(results) == 1


def test_cuda_row():
    ok = doctor.check_gpu(GpuInfo(count=2, cuda="13.0", names=("NVIDIA H200", "NVIDIA H200")), "2.11.0", True)
    assert (ok.status, ok.found) == (Status.OK, "CUDA 13.0, 2 GPU(s): NVIDIA H200")
    cpu_build = doctor.check_gpu(GpuInfo(count=0, cuda=None), "2.13.0+cpu", gpu_machine=True)
    assert cpu_build.fix == "pip install torch==2.13.0" and "CPU build" in cpu_build.note
    broken = doctor.check_gpu(GpuInfo(count=0, cuda=None, error="OSError: libcudart.so"), "2.13.0", False)
    assert broken.status is Status.ERROR and broken.status.failed


# ------------------------------------------------------------------ config requirements


CPU_VERSIONS = {"transformers": "5.23.0", "deepspeed": "0.19.8", "wandb": "0.31.0", "tensorboard": "2.21.0"}


def test_cpu_config_runs_on_cpu():
    results = doctor.check_config_requirements(
        fake_config(track_with=["stdout", "tensorboard"]),
        versions=CPU_VERSIONS,
        gpu_count=0,
        reqs=reqs("deepspeed>=0.16"),
    )
    rows = by_name(results)
    assert set(rows) == {"deepspeed", "transformers", "tensorboard"}
    assert rows["deepspeed"].required == ">=0.16" and "actor_train (deepspeed_train)" in rows["deepspeed"].note
    assert doctor.exit_code(results) == 0


def test_gpu_config_on_cpu_machine_fails():
    cfg = fake_config(
        train="megatron_train", infer="sglang", devices=list(range(8)), track_with="wandb", num_gpus_per_node=8
    )
    versions = {**CPU_VERSIONS, "sglang": None, "megatron-core": None}
    results = doctor.check_config_requirements(
        cfg, versions=versions, gpu_count=0, reqs=reqs(optional=("sglang>=0.5.16",))
    )
    rows = by_name(results)
    # Optional for roll, but required by this config: missing, not optional-missing.
    assert (rows["sglang"].status, rows["sglang"].required, rows["sglang"].fix) == (
        Status.MISSING,
        ">=0.5.16",
        "pip install 'roll[gpu]'",
    )
    assert (rows["megatron-core"].status, rows["megatron-core"].fix) == (Status.MISSING, "pip install megatron-core")
    assert rows["wandb"].status is Status.OK
    assert (rows["gpus"].required, rows["gpus"].found, rows["gpus"].status) == (">=8 CUDA GPU(s)", "0", Status.MISSING)
    assert doctor.exit_code(results) == 1
    versions.update({"sglang": "0.5.16", "megatron-core": "0.14.0"})
    assert doctor.exit_code(doctor.check_config_requirements(cfg, versions=versions, gpu_count=8, reqs=reqs())) == 0


def test_gpus_needed_from_device_mapping():
    cfg = fake_config(devices=[2, 5])
    assert doctor.gpus_needed(cfg) == 6
    # One node: the whole mapping is here, whatever num_gpus_per_node says; two nodes: half of it.
    assert doctor.gpus_needed(fake_config(devices=list(range(16)), num_gpus_per_node=8)) == 16
    assert doctor.gpus_needed(fake_config(devices=list(range(16)), num_gpus_per_node=8, num_nodes=2)) == 8
    assert doctor.gpus_needed(fake_config()) == 0
    cfg.critic = worker("deepspeed_train", [9])
    assert doctor.gpus_needed(cfg) == 10
    rows = by_name(doctor.check_config_requirements(cfg, versions=CPU_VERSIONS, gpu_count=4, reqs=reqs()))
    assert (rows["gpus"].required, rows["gpus"].status) == (">=10 CUDA GPU(s)", Status.MISSING)


def test_gpu_strategy_with_empty_mapping_needs_one_gpu():
    cfg = fake_config(infer="sglang")
    rows = by_name(
        doctor.check_config_requirements(cfg, versions={**CPU_VERSIONS, "sglang": "0.5.16"}, gpu_count=0, reqs=reqs())
    )
    assert (rows["gpus"].required, rows["gpus"].status) == (">=1 CUDA GPU(s)", Status.MISSING)
    assert rows["sglang"].status is Status.OK


def test_needs_come_from_the_registries(monkeypatch):
    """A strategy or tracker registered from a user module is known to the doctor with what its entry declares;
    vllm, which no registered backend serves, is an error naming the replacement."""
    import tests.extensions.user_plugins  # noqa: F401  (registers its tracker and backend before the patch)
    from roll.strategies import registry

    monkeypatch.setattr(registry, "STRATEGIES", copy.deepcopy(registry.STRATEGIES))  # the test's entries vanish
    registry.register_strategy(
        "user_gpu_infer",
        "user_mod:Engine",
        {"actor_infer"},
        packages=("user-engine",),
        needs_gpu=True,
        options="roll.config.strategies:HFInferOptions",
    )
    cfg = fake_config(infer="user_gpu_infer", track_with="tests.extensions.user_plugins:tally")
    rows = by_name(doctor.check_config_requirements(cfg, versions=CPU_VERSIONS, gpu_count=0, reqs=reqs()))
    assert rows["user-engine"].status is Status.MISSING and "actor_infer (user_gpu_infer)" in rows["user-engine"].note
    assert rows["gpus"].required == ">=1 CUDA GPU(s)" and "track_with" not in rows
    vllm = by_name(
        doctor.check_config_requirements(fake_config(infer="vllm"), versions=CPU_VERSIONS, gpu_count=0, reqs=reqs())
    )["actor_infer strategy"]
    assert vllm.status is Status.ERROR and "sglang" in vllm.fix


def test_unknown_strategy_and_tracker_are_errors():
    results = doctor.check_config_requirements(
        fake_config(infer="hf_infr", track_with="mlflow"), versions=CPU_VERSIONS, gpu_count=0, reqs=reqs()
    )
    rows = by_name(results)
    assert rows["actor_infer strategy"].status is Status.ERROR and "hf_infer" in rows["actor_infer strategy"].required
    assert rows["actor_infer strategy"].found == "hf_infr"
    assert rows["track_with"].status is Status.ERROR and "wandb" in rows["track_with"].required
    assert doctor.exit_code(results) == 1


# ------------------------------------------------------------------ report and command line


def test_format_table_aligns_columns_and_lists_notes():
    text = doctor.format_table(
        [
            CheckResult("torch", ">=2.4", "2.13.0", Status.OK),
            CheckResult("sglang", ">=0.5.16", None, Status.MISSING, "pip install x", "why"),
        ]
    )
    lines = text.splitlines()
    assert lines[0].split() == ["name", "required", "found", "status", "fix"]
    assert lines[2].split() == ["sglang", ">=0.5.16", "-", "missing", "pip", "install", "x"]
    assert lines[0].index("status") == lines[2].index("missing")
    assert lines[-2:] == ["notes:", "  sglang: why"]


def test_config_load_error_is_one_line_exit_2(tmp_path, capsys):
    assert cli.main(["doctor", "--config-name", "no_such_config", "--config-path", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no_such_config" in err


def test_overrides_without_config_name_exit_2(capsys):
    assert cli.main(["doctor", "num_gpus_per_node=8"]) == 2
    assert "--config-name" in capsys.readouterr().err


TINY_CONFIG = """\
defaults:
  - roll_agentic
  - _self_
track_with: tensorboard
actor_train:
  strategy_args:
    strategy_name: deepspeed_train
custom_envs:
  SimpleSokoban:
    env_type: sokoban
"""


@pytest.fixture
def config_dir(tmp_path):
    pytest.importorskip("roll.config.loader")
    (tmp_path / "tiny.yaml").write_text(TINY_CONFIG)
    return str(tmp_path)


def test_real_config_on_cpu(config_dir, capsys):
    env_code = doctor.exit_code(doctor.check_environment(doctor.load_roll_requirements()))
    assert cli.main(["doctor", "--config-path", config_dir, "--config-name", "tiny"]) == env_code
    out = capsys.readouterr().out
    rows = [line.split() for line in out[out.index("config 'tiny'") :].splitlines()[2:5]]
    roll_reqs = doctor.load_roll_requirements()
    assert rows == [
        [name, str(roll_reqs.find(name).specifier), doctor.installed_version(name), "ok"]
        for name in ("deepspeed", "transformers", "tensorboard")
    ]


def test_real_config_needing_more_gpus_exits_1(config_dir, capsys):
    devices = "[" + ",".join(map(str, range(64))) + "]"
    argv = [
        "doctor",
        "--config-path",
        config_dir,
        "--config-name",
        "tiny",
        "num_gpus_per_node=64",
        f"actor_train.device_mapping={devices}",
        f"actor_infer.device_mapping={devices}",
    ]
    assert cli.main(argv) == 1
    out = capsys.readouterr().out
    assert ">=64 CUDA GPU(s)" in out and "cannot run here" in out.splitlines()[-1]


def test_real_config_bad_key_exit_2(config_dir, capsys):
    assert cli.main(["doctor", "--config-path", config_dir, "--config-name", "tiny", "no_such_key=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no_such_key" in err


def test_duplicate_subcommand_raises():
    with pytest.raises(ValueError, match="'doctor' is already registered"):
        cli.command("doctor", help="again", add_arguments=lambda p: None)(lambda args: 0)


@pytest.mark.parametrize("module", [["roll.launch.doctor"], ["roll", "doctor"]])
def test_module_entry_points_print_the_table(module):
    proc = subprocess.run([sys.executable, "-m", *module], cwd=REPO, capture_output=True, text=True, timeout=120)
    lines = proc.stdout.splitlines()
    assert lines[1].split()[:4] == ["name", "required", "found", "status"], proc.stdout + proc.stderr
    assert any(line.split()[:1] == ["torch"] for line in lines)
    # Exit 0 exactly when the verdict says ok.
    assert (proc.returncode == 0) == (lines[-1] == "roll ok") and proc.returncode in (0, 1)


def test_real_loader_on_example_configs():
    from roll.config.agentic import AgenticConfig
    from roll.config.loader import is_fragment
    from roll.config.rlvr import RLVRConfig

    paths = sorted(p for p in (REPO / "examples" / "config").glob("*.yaml") if not is_fragment(p))
    assert paths, "examples/config has pipeline configs"
    for path in paths:
        schema = RLVRConfig if path.stem.startswith("rlvr") else AgenticConfig
        if "gpu" in path.stem or "strategy_name: sglang" in path.read_text():
            continue  # GPU configs name backends (sglang) that this CPU machine does not have
        results = doctor.check_config_requirements(cached_config(path.stem, schema=schema))
        assert all(r.status is not Status.ERROR for r in results), (path.stem, results)


def test_megatron_config_with_transformer_engine_needs_it():
    cfg = fake_config(train="megatron_train", devices=[0], num_gpus_per_node=1)
    cfg.actor_train.strategy_args.strategy_config = {"transformer_impl": "transformer_engine"}
    versions = {**CPU_VERSIONS, "megatron-core": "0.19.2", "transformer-engine": None}
    rows = by_name(doctor.check_config_requirements(cfg, versions=versions, gpu_count=1, reqs=reqs()))
    assert rows["megatron-core"].status is Status.OK
    assert (rows["transformer-engine"].status, rows["transformer-engine"].fix) == (
        Status.MISSING,
        "pip install transformer-engine",
    )
    assert "actor_train (megatron_train)" in rows["transformer-engine"].note
