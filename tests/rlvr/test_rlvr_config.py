"""RLVR config: the shipped configs load, data files are validated through the config (row numbers in the error),
and cross-field rules name the key and the fix."""

import json
from pathlib import Path

import pytest

from roll.config.errors import ConfigError
from roll.config.rlvr import RLVRConfig
from roll.launch.command import load_checked
from roll.launch.preflight import data_files

REPO = Path(__file__).resolve().parents[2]


def load(name="rlvr_tiny", *overrides):
    return load_checked(name, overrides=list(overrides), schema=RLVRConfig)


def test_tiny_config_loads_and_resolves_data_paths():
    cfg = load()
    assert cfg.num_return_sequences_in_group == 8 and cfg.adv_estimator == "grpo"
    assert cfg.actor_train.data_args.file_name == ["data/math_tiny/train.jsonl"]  # as written; resolved at launch:
    assert data_files(cfg) == {
        "train": [str(REPO / "data/math_tiny/train.jsonl")],
        "validation": [str(REPO / "data/math_tiny/test.jsonl")],
    }
    assert cfg.validation.generating_args.do_sample is False
    assert cfg.tiny_model is not None and cfg.sft_warmup.enabled


def test_gpu_config_loads():
    """Loads as is where sglang and liger-kernel are installed; on a CPU machine the only complaints are the
    missing packages."""
    import importlib.util

    overrides = []
    if importlib.util.find_spec("sglang") is None:
        with pytest.raises(ConfigError) as err:
            load("rlvr_qwen05b_gpu")
        assert err.value.key == "actor_infer.strategy_args.strategy_name" and "sglang" in str(err.value)
        overrides = ["actor_infer.strategy_args.strategy_name=hf_infer", "~actor_infer.strategy_args.strategy_config"]
    if importlib.util.find_spec("liger_kernel") is None:
        with pytest.raises(ConfigError) as err:
            load("rlvr_qwen05b_gpu", *overrides)
        assert err.value.key == "actor_train.model_args.use_liger_kernel" and "pip install liger-kernel" in str(
            err.value
        )
        overrides.append("actor_train.model_args.use_liger_kernel=false")
    cfg = load("rlvr_qwen05b_gpu", *overrides)
    assert cfg.num_gpus_per_node == 1 and cfg.pretrain == "Qwen/Qwen2.5-0.5B-Instruct"
    assert cfg.actor_train.device_mapping == [0] and cfg.actor_infer.device_mapping == [0]
    assert cfg.actor_train.strategy_args.strategy_config["zero_optimization"]["stage"] == 2
    assert cfg.prompt_length + cfg.response_length <= cfg.sequence_length


def write_jsonl(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_malformed_rows_are_listed_with_row_numbers(tmp_path):
    bad = write_jsonl(
        tmp_path / "bad.jsonl",
        [
            {"prompt": "What is 1 + 1?", "ground_truth": "2", "tag": "math"},
            {"prompt": "   ", "ground_truth": "2", "tag": "math"},
            {"prompt": "What is 2 + 2?", "tag": "math"},
            "{not json",
        ],
    )
    with pytest.raises(ConfigError) as err:
        load("rlvr_tiny", f"actor_train.data_args.file_name=[{bad}]")
    msg = str(err.value)
    assert err.value.key == "actor_train.data_args.file_name"
    assert "3 malformed row(s)" in msg
    assert "row 1 (line 2): empty prompt" in msg and "row 2 (line 3): missing ground_truth" in msg
    assert "row 3 (line 4): invalid JSON" in msg


def test_validation_file_rows_checked_too(tmp_path):
    bad = write_jsonl(tmp_path / "val.jsonl", [{"prompt": "What is 1 + 1?", "ground_truth": None, "tag": "math"}])
    with pytest.raises(ConfigError, match=r"(?s)validation.file_name.*row 0 \(line 1\): missing ground_truth"):
        load("rlvr_tiny", f"validation.file_name=[{bad}]")


def test_messages_column_and_custom_keys(tmp_path):
    rows = [{"chat": [{"role": "user", "content": "What is 3 + 4?"}], "answer": 7, "domain": "math"}]
    path = write_jsonl(tmp_path / "chat.jsonl", rows)
    cfg = load(
        "rlvr_tiny",
        f"actor_train.data_args.file_name=[{path}]",
        "actor_train.data_args.prompt=null",
        "actor_train.data_args.messages=chat",
        "ground_truth_key=answer",
        "tag_key=domain",
        "validation.file_name=[]",
    )
    assert cfg.actor_train.data_args.messages == "chat"
    with pytest.raises(ConfigError, match="not found"):
        load("rlvr_tiny", f"actor_train.data_args.file_name=[{path}]", "validation.file_name=[]")


def test_default_tag_for_data_without_a_tag_column(tmp_path):
    path = write_jsonl(tmp_path / "untagged.jsonl", [{"prompt": "What is 1 + 1?", "ground_truth": "2"}])
    with pytest.raises(ConfigError) as err:
        load("rlvr_tiny", f"actor_train.data_args.file_name=[{path}]")
    assert err.value.key == "actor_train.data_args.file_name" and "default_tag" in str(err.value)
    cfg = load("rlvr_tiny", f"actor_train.data_args.file_name=[{path}]", "default_tag=math")
    assert cfg.default_tag == "math"
    with pytest.raises(ConfigError, match="default_tag.*non-empty"):
        load("rlvr_tiny", "default_tag=''")


@pytest.mark.parametrize("override", ["validation=null", "~validation", "validation.file_name=null"])
def test_validation_block_can_be_left_out_or_null(override):
    """No validation, and no max_new_tokens to set against a small response_length (8 here; the generation
    default is 128)."""
    cfg = load("rlvr_tiny", override)
    assert cfg.validation.file_name == []
    assert cfg.validation.generating_args.max_new_tokens == cfg.response_length == 8
    assert cfg.validation.generating_args.do_sample is False


def test_validation_max_new_tokens_follows_response_length_unless_set():
    cfg = load("rlvr_tiny", "~validation.generating_args.max_new_tokens", "response_length=10")
    assert cfg.validation.generating_args.max_new_tokens == 10 and cfg.validation.file_name
    assert (
        load("rlvr_tiny", "validation.generating_args.max_new_tokens=5").validation.generating_args.max_new_tokens == 5
    )


@pytest.mark.parametrize(
    "override, key, fragment",
    [
        ("actor_train.data_args.file_name=[data/nope.jsonl]", "actor_train.data_args.file_name", "no such file"),
        (
            "actor_train.data_args.file_name=[data/math_tiny/train.csv]",
            "actor_train.data_args.file_name",
            "unsupported file type",
        ),
        ("actor_train.data_args.file_name=[]", "actor_train.data_args.file_name", "at least one"),
        ("actor_train.data_args.messages=messages", "actor_train.data_args.messages", "exclusive"),
        ("truncation=middle", "truncation", "must be one of error, left, right"),
        (
            "actor_infer.generating_args.max_new_tokens=9",
            "actor_infer.generating_args.max_new_tokens",
            "response_length=8",
        ),
        ("sequence_length=70", "sequence_length", "prompt_length (64) + response_length (8)"),
        (
            "num_return_sequences_in_group=1 actor_train.training_args.per_device_train_batch_size=16 "
            "actor_train.training_args.gradient_accumulation_steps=1",
            "num_return_sequences_in_group",
            "grpo compares",
        ),
        ("num_return_sequences_in_group=3", "actor_train.training_args.gradient_accumulation_steps", "48 samples"),
        ("dynamic_sampling.enabled=false", "is_use_additional_prompts", "dynamic_sampling.enabled"),
        ("dynamic_sampling.mean_low=0.9 dynamic_sampling.mean_high=0.1", "dynamic_sampling.mean_low", "<= mean_high"),
        ("adv_estimator=gigpo", "adv_estimator", "agentic"),
        ("reward_shift=true", "reward_norm", "need a scope"),
        ("sft_warmup.batch_size=32", "sft_warmup.batch_size", "multiple"),
        ("sft_warmup.answer_template=x", "sft_warmup.answer_template", "{answer}"),
    ],
)
def test_rule_violations_name_key_and_fix(override, key, fragment):
    with pytest.raises(ConfigError) as err:
        load("rlvr_tiny", *override.split())
    assert err.value.key == key, str(err.value)
    assert fragment in str(err.value)


def test_unknown_key_is_rejected_with_suggestion():
    with pytest.raises(ConfigError, match="did you mean 'max_additional_running_prompts'"):
        load("rlvr_tiny", "+max_additional_running_prompt=4")
