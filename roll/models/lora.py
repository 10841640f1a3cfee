"""LoRA adapters on peft: the one module the training strategies, ``hf_infer`` and ``roll merge-lora`` call.

- :func:`add_adapters` wraps a causal LM in peft's ``get_peft_model`` with a ``LoraConfig`` from the config's
  :class:`~roll.config.lora.LoraSettings`: base weights frozen, adapters trainable (``B`` starts at zero, so the
  wrapped model computes what the base does).
- :func:`export_plan` and :class:`ExportEntry`: the weights the engine gets while the weight sync sends full
  weights: each base weight under its plain Hugging Face name, with the adapter merged in by peft's merge math,
  ``W + transpose(B A) x alpha / r``, on gathered copies; the training model is never modified.
- :func:`adapter_state_dict` (the sending side of an adapter-only sync: peft's state-dict names, no adapter name)
  and :func:`load_adapter` (the receiving side: wraps an engine's model on first use, then
  ``set_peft_model_state_dict``).
- :func:`merge_adapter_dir`: an adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``) merged
  into a plain Hugging Face model that loads without peft.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from roll.config.lora import ALL_LINEAR, LoraSettings

#: peft's name of the one adapter roll trains.
ADAPTER = "default"
#: What peft puts before a wrapped model's own parameter names.
PEFT_PREFIX = "base_model.model."


def lora_config(settings: LoraSettings) -> Any:
    """peft's ``LoraConfig`` of ``settings`` (plain LoRA: no bias, no DoRA)."""
    from peft import LoraConfig

    target = list(settings.target) if isinstance(settings.target, tuple) else settings.target
    return LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=target,
        bias="none",
        task_type="CAUSAL_LM",
    )


def add_adapters(model: torch.nn.Module, settings: LoraSettings, checkpointing: bool = False) -> torch.nn.Module:
    """``model`` wrapped by peft with adapters of ``settings`` (only they require gradients). ``checkpointing``:
    the model checkpoints its layers, so its input embeddings' output is made to require gradients (with frozen
    embeddings a reentrant checkpoint would otherwise pass no gradient to the adapters inside it)."""
    from peft import get_peft_model

    wrapped = get_peft_model(model, lora_config(settings), adapter_name=ADAPTER)
    name = wrapped.peft_config[ADAPTER].base_model_name_or_path  # peft takes the model's (as it was loaded)
    if name and Path(name).is_dir():
        wrapped.peft_config[ADAPTER].base_model_name_or_path = str(Path(name).resolve())  # merge from anywhere
    if checkpointing:
        wrapped.enable_input_require_grads()
    return wrapped


def is_peft(model: torch.nn.Module) -> bool:
    """Whether ``model`` (or the module a DeepSpeed engine wraps) is a peft model."""
    return hasattr(getattr(model, "module", model), "peft_config")


def adapters_off(model: torch.nn.Module) -> Any:
    """A context in which the peft ``model`` computes as its base model (peft's ``disable_adapter``)."""
    return getattr(model, "module", model).disable_adapter()


@dataclass(frozen=True)
class ExportEntry:
    """One exported weight: ``name`` (the plain model's parameter name), ``source`` (the peft model's parameter
    holding the base weight) and, for a weight with an adapter, its ``lora_a`` (r, in) and ``lora_b`` (out, r)
    parameters, ``scaling`` (alpha / r) and ``fan_in_fan_out`` (the base stores (in, out))."""

    name: str
    source: str
    lora_a: str | None = None
    lora_b: str | None = None
    scaling: float = 1.0
    fan_in_fan_out: bool = False

    def sources(self) -> list[str]:
        """The peft model's parameters this weight is computed from."""
        return [self.source] + ([self.lora_a, self.lora_b] if self.lora_a and self.lora_b else [])

    @torch.no_grad()
    def merge(self, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The weight from whole tensors of :meth:`sources`: the base, or peft's merge ``W + transpose(B A) x
        scaling`` (half-precision adapters multiplied in fp32 and cast back, as peft does on CPU; the sum cast to
        the base's dtype). A new tensor for a merged weight, the base tensor itself otherwise."""
        base = tensors[self.source]
        if self.lora_a is None or self.lora_b is None:
            return base
        a, b = tensors[self.lora_a], tensors[self.lora_b]
        half = b.dtype in (torch.float16, torch.bfloat16)
        delta = (b.float() @ a.float()) if half else b @ a  # (out, r) @ (r, in) -> (out, in)
        delta = (delta.T if self.fan_in_fan_out else delta) * self.scaling
        if half:
            delta = delta.to(b.dtype)
        return (base + delta.to(base.device)).to(base.dtype)


def export_plan(model: torch.nn.Module) -> list[ExportEntry]:
    """The plain model's weights as computed from the peft ``model``'s parameters, in ``named_parameters`` order
    (adapter parameters are not exported; a tied LM head is not a separate parameter, as in the plain model)."""
    from peft.tuners.lora import LoraLayer

    module = getattr(model, "module", model)
    layers = {name: m for name, m in module.named_modules() if isinstance(m, LoraLayer)}
    prefix = module.base_model.prefix  # "lora_": the adapter parameters' module names
    out = []
    for name, _ in module.named_parameters():
        if f".{prefix}" in name:
            continue
        plain = name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")
        path, _, leaf = name.rpartition(".base_layer.")
        if path and leaf == "weight" and path in layers:
            layer = layers[path]
            out.append(
                ExportEntry(
                    plain,
                    name,
                    lora_a=f"{path}.lora_A.{ADAPTER}.weight",
                    lora_b=f"{path}.lora_B.{ADAPTER}.weight",
                    scaling=float(layer.scaling[ADAPTER]),
                    fan_in_fan_out=bool(layer.fan_in_fan_out),
                )
            )
        else:
            out.append(ExportEntry(plain, name))
    return out


def adapter_names(model: torch.nn.Module) -> list[str]:
    """The peft model's adapter parameters (the trainable ones), in ``named_parameters`` order."""
    module = getattr(model, "module", model)
    prefix = module.base_model.prefix
    return [n for n, _ in module.named_parameters() if f".{prefix}" in n]


def adapter_state_dict(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """peft's state dict of the adapter from whole tensors of :func:`adapter_names` (names as
    ``get_peft_model_state_dict`` gives them: no adapter name, e.g. ``...q_proj.lora_A.weight``)."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(getattr(model, "module", model), state_dict=dict(tensors), adapter_name=ADAPTER)


def adapter_config(model: torch.nn.Module) -> dict[str, Any]:
    """The adapter's peft config as a plain dict (sets as sorted lists), what :func:`load_adapter` rebuilds."""
    config = getattr(model, "module", model).peft_config[ADAPTER].to_dict()
    return {k: _plain(v) for k, v in config.items()}


def _plain(value: Any) -> Any:
    """A set as a sorted list, an enum as its value (peft's ``task_type``, ``peft_type``), anything else as is."""
    if isinstance(value, set):
        return sorted(value)
    return value.value if isinstance(value, enum.Enum) else value


def load_adapter(
    model: torch.nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]], config: dict[str, Any]
) -> torch.nn.Module:
    """Load an adapter (peft's state-dict names, as :func:`adapter_state_dict` gives them) into ``model``,
    wrapping it with peft's ``config`` (:func:`adapter_config`) on first use; returns the peft model. Every
    adapter weight must be given and fit (a KeyError / ValueError names the first that does not)."""
    from peft import get_peft_config, get_peft_model, set_peft_model_state_dict

    if not is_peft(model):
        settings = dict(config, inference_mode=True)
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):  # peft's initialization must not move the engine's sampling RNG
            model = get_peft_model(model, get_peft_config(settings), adapter_name=ADAPTER)
    state = dict(named_tensors)
    expected = {n.replace(f".{ADAPTER}.", ".") for n in adapter_names(model)}
    missing, unknown = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unknown:
        raise KeyError(
            f"load_adapter: the adapter does not fit the engine's model: missing {missing[:3]}, unknown "
            f"{unknown[:3]} ({len(missing)} missing, {len(unknown)} unknown)"
        )
    set_peft_model_state_dict(model, state, adapter_name=ADAPTER)
    return model


def linear_names(path: str | None) -> set[str]:
    """The leaf names of the modules peft's ``all-linear`` gives adapters in the model at ``path`` (a directory or
    a cached hub name; built from its config on the meta device, no weights loaded); empty when it cannot be
    read."""
    from peft import get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(path) if path else None
    except (OSError, ValueError):
        config = None
    if config is None:
        return set()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    settings = LoraSettings(rank=1, alpha=1.0, dropout=0.0, target=ALL_LINEAR)
    wrapped = get_peft_model(model, lora_config(settings))
    return {name.rsplit(".", 1)[-1] for name in wrapped.peft_config[ADAPTER].target_modules}


def merge_adapter_dir(adapter_dir: str | Path, out: str | Path, base: str | None = None) -> Path:
    """Merge the adapter at ``adapter_dir`` into its base model (``base``, else the adapter's
    ``base_model_name_or_path``) and save a plain Hugging Face model (and the tokenizer found next to the adapter,
    else the base's) to ``out``: it loads with ``AutoModelForCausalLM`` alone. Returns ``out``."""
    import json

    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter_dir, out = Path(adapter_dir), Path(out)
    config_file = adapter_dir / "adapter_config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{adapter_dir} is not a peft adapter directory (no adapter_config.json)")
    base = base or json.loads(config_file.read_text()).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{config_file} names no base_model_name_or_path; pass the base model with --base")
    model = AutoModelForCausalLM.from_pretrained(base, dtype="auto")
    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out)
    tokenizer_dir = adapter_dir if (adapter_dir / "tokenizer_config.json").is_file() else base
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
    return out
