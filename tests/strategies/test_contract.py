"""The registry entry of a strategy is its whole contract: the role bases declare every method a caller uses, the
abilities are Protocols, and both are checked against the class by the registry (never by method-name tables)."""

from __future__ import annotations

import copy
import sys
import types

import pytest

from roll.strategies import registry
from roll.strategies.abilities import ABILITIES, protocol_members
from roll.strategies.base import CriticStrategy, InferenceStrategy, TrainStrategy, contract_gaps


@pytest.fixture
def scratch_registry(monkeypatch):
    """Registrations of a test vanish afterwards."""
    monkeypatch.setattr(registry, "STRATEGIES", copy.deepcopy(registry.STRATEGIES))


@pytest.mark.parametrize(
    "name",
    [
        "hf_infer",
        "deepspeed_train",
        "deepspeed_infer",
        "fsdp2_train",
        "fsdp2_infer",
        "megatron_train",
        "megatron_infer",
        "sglang",
    ],
)  # sglang imports SGLang lazily
def test_every_builtin_class_fulfils_its_entry(name):
    spec = registry.strategy_spec(name)
    for role in spec.roles:
        cls = registry.get_strategy_class(name, role)  # raises on a gap
        assert contract_gaps(cls, role, spec.abilities) == []


@pytest.mark.parametrize("name", ["deepspeed_train", "fsdp2_train", "megatron_train"])
def test_critics_have_values_and_no_log_probs(name):
    critic = registry.get_strategy_class(name, "critic")
    actor = registry.get_strategy_class(name, "actor_train")
    assert issubclass(critic, CriticStrategy) and not issubclass(critic, TrainStrategy)
    assert not hasattr(critic, "compute_log_probs") and callable(critic.compute_values)
    assert issubclass(actor, TrainStrategy) and not hasattr(actor, "compute_values")


def test_ability_protocols_name_the_methods_callers_use():
    assert protocol_members(ABILITIES["submit"]) == ["submit", "poll", "abort"]
    assert protocol_members(ABILITIES["weight_group"]) == [
        "weight_group_ranks",
        "init_weight_group",
        "update_weights_distributed",
    ]
    assert protocol_members(ABILITIES["ipc_weights"]) == ["load_weight_bucket"]


def _user_module(**classes) -> str:
    """A module of user strategy classes, imported (as a registering user module would be)."""
    mod = types.ModuleType("user_backend_under_test")
    for name, cls in classes.items():
        cls.__module__ = mod.__name__
        setattr(mod, name, cls)
    sys.modules[mod.__name__] = mod
    return mod.__name__


class _Generator(InferenceStrategy):
    def initialize(self, ctx):
        pass

    def load_weights(self, named_tensors):
        pass

    def generate(self, prompts, args, max_new_tokens=None):
        return []


def test_registration_refuses_a_class_missing_a_declared_ability(scratch_registry):
    module = _user_module(Generator=_Generator)
    with pytest.raises(
        TypeError,
        match=r"cannot serve actor_infer with abilities \['weight_group'\]: implement "
        r"weight_group_ranks \(ability weight_group\); implement init_weight_group",
    ):
        registry.register_strategy(
            "user_gen",
            f"{module}:Generator",
            {"actor_infer"},
            abilities={"weight_group"},
            options="roll.config.strategies:HFInferOptions",
        )
    assert "user_gen" not in registry.list_strategies()
    registry.register_strategy(
        "user_gen", f"{module}:Generator", {"actor_infer"}, options="roll.config.strategies:HFInferOptions"
    )
    assert registry.get_strategy_class("user_gen", "actor_infer") is _Generator


def test_a_class_serving_a_role_it_does_not_derive_from_is_refused(scratch_registry):
    module = _user_module(Generator=_Generator)
    with pytest.raises(TypeError, match="cannot serve reference .*: subclass ScoringStrategy"):
        registry.register_strategy(
            "user_gen2",
            f"{module}:Generator",
            {"actor_infer", "reference"},
            options="roll.config.strategies:HFInferOptions",
        )


def test_a_class_imported_later_is_checked_when_resolved(scratch_registry, tmp_path, monkeypatch):
    (tmp_path / "late_backend_mod.py").write_text(
        "from roll.strategies.base import InferenceStrategy\n"
        "class Late(InferenceStrategy):\n"
        "    def initialize(self, ctx): pass\n"
        "    def load_weights(self, named_tensors): pass\n"
    )  # no generate: still abstract
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.register_strategy(
        "user_late", "late_backend_mod:Late", {"actor_infer"}, options="roll.config.strategies:HFInferOptions"
    )  # not imported yet: accepted
    with pytest.raises(TypeError, match="cannot serve actor_infer .*: implement generate"):
        registry.get_strategy_class("user_late", "actor_infer")


def test_entry_values_are_checked(scratch_registry):
    with pytest.raises(ValueError, match="unknown roles \\['learner'\\]"):
        registry.register_strategy("x", "m:C", {"learner"}, options="m:O")
    with pytest.raises(ValueError, match="prefix_sharing='maybe'"):
        registry.register_strategy("x", "m:C", {"actor_infer"}, options="m:O", prefix_sharing="maybe")
    with pytest.raises(ValueError, match="unknown abilities \\['teleport'\\]"):
        registry.register_strategy("x", "m:C", {"actor_infer"}, options="m:O", abilities={"teleport"})


def test_the_strategy_registry_is_the_houses_registry(scratch_registry):
    """One registry class per extension point: duplicates raise, a failed lookup lists the names, a user entry
    named ``"package.module:name"`` imports its module."""
    from roll.registry import Registry

    assert isinstance(registry.STRATEGIES, Registry)
    with pytest.raises(ValueError, match="strategy 'hf_infer' is already registered"):
        registry.register_strategy("hf_infer", "m:C", {"actor_infer"}, options="m:O")
    assert registry.strategy_spec("hf_infer").import_path == "roll.strategies.hf_infer:HFInferStrategy"
    with pytest.raises(ValueError, match="unknown strategy 'nope'; valid: .*deepspeed_train, .*hf_infer"):
        registry.strategy_spec("nope")
    with pytest.raises(ValueError, match="cannot import module 'no_such_module'"):
        registry.strategy_spec("no_such_module:backend")
    module = _user_module(Generator=_Generator)
    registry.register_strategy(
        "user_gen3", f"{module}:Generator", {"actor_infer"}, options="roll.config.strategies:HFInferOptions"
    )
    assert (
        registry.strategy_spec(f"{module}:user_gen3").name == "user_gen3" and "user_gen3" in registry.list_strategies()
    )
