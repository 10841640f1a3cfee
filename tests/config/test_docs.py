"""docs/config.md is generated from the dataclass help texts; every field has one."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from roll.config.fields import fields_without_help, nested_dataclasses

REPO = Path(__file__).resolve().parents[2]


def generator():
    spec = importlib.util.spec_from_file_location("gen_config_docs", REPO / "scripts" / "gen_config_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = generator()


@pytest.mark.parametrize("schema", GEN.schemas(), ids=lambda s: s.__name__)
def test_every_field_has_help(schema):
    missing = fields_without_help(schema)
    assert not missing, f"fields without a help text (add help= to fld(...)): {missing}"


def test_every_strategy_option_has_help():
    from roll.strategies.registry import list_strategies, strategy_spec

    for name in list_strategies():
        cls = strategy_spec(name).options_class()
        assert not fields_without_help(cls), (name, fields_without_help(cls))


def test_docs_up_to_date():
    text = GEN.render()
    on_disk = (REPO / "docs" / "config.md").read_text()
    assert on_disk == text, "docs/config.md is out of date; run: python scripts/gen_config_docs.py"


def test_docs_list_every_key_with_type_default_and_choices():
    text = GEN.render()
    from roll.strategies.registry import list_strategies, strategy_spec

    options = [strategy_spec(name).options_class() for name in list_strategies()]
    for schema in GEN.schemas() + options:
        for cls in nested_dataclasses(schema):
            for f in dataclasses.fields(cls):
                assert f"| `{f.name}` |" in text, f"{cls.__name__}.{f.name} missing from docs"
    assert "| `track_with` | `str` | `'stdout'` |  | Tracker registered with register_tracker" in text
    assert "| `generate_opt_level` | `int` | `1` | `0`, `1` |" in text


def test_check_mode_reports_drift(tmp_path, monkeypatch):
    monkeypatch.setattr(GEN, "OUT", tmp_path / "config.md")
    assert GEN.main(["--check"]) == 1
    assert GEN.main([]) == 0
    assert GEN.main(["--check"]) == 0


def test_docs_name_fsdp2_keys_accepted_beyond_the_fields():
    """FSDP2's ignored and unsupported ROLL/verl keys are not fields: its docstring (in the reference) names them."""
    from roll.config.fsdp2 import IGNORED, UNSUPPORTED

    text = GEN.render()
    for key in [*IGNORED, *UNSUPPORTED, "mixed_precision: {param_dtype, reduce_dtype}"]:
        assert f"``{key}``" in text, key
