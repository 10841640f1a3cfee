"""The tiny model factory: a normal Hugging Face directory, a tokenizer fitted to env text."""

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from roll.agentic.chat import ChatFormatter


def test_tiny_model_loads_with_auto_classes(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert model.config.model_type == "qwen2"
    assert model.config.vocab_size == len(tok)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"


def test_action_words_and_markup_are_single_tokens(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    for text in ["<answer>", "</answer>", "Up", "Down", "Left", "Right"]:
        assert len(tok(text, add_special_tokens=False)["input_ids"]) == 1, text
    # grid symbols stay one token each, so a 4-cell row is 4 tokens
    assert len(tok("#_PX", add_special_tokens=False)["input_ids"]) == 4


def test_round_trip_and_chat_template(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = "Push the box X onto O.\n_#P_\n"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_turn_delta_matches_template(tiny_model_dir):
    """First prompt + reply + delta == the template applied to the whole conversation."""
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    fmt = ChatFormatter(tok, "sys")
    reply = fmt.encode("<answer>Up</answer>") + [fmt.eos_id]
    ids = fmt.first_prompt("grid one") + reply + fmt.turn_delta("grid two")
    messages = [
        {"role": "user", "content": "grid one"},
        {"role": "assistant", "content": "<answer>Up</answer>"},
        {"role": "user", "content": "grid two"},
    ]
    expected = tok.apply_chat_template(
        [{"role": "system", "content": "sys"}] + messages, tokenize=False, add_generation_prompt=True
    )
    assert tok.decode(ids) == expected


def test_initializer_range_reaches_the_weights(tmp_path):
    """The std of the initial weights is the configured one (0.1 by default; HF's 0.02 stalls a model this small)."""
    from roll.models.tiny import build_tiny_model

    small = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=300,
        corpus=["a b c", "<answer>Up</answer>"],
    )
    for std in (0.1, 0.02):
        path = build_tiny_model(tmp_path / f"m{std}", initializer_range=std, **small)
        model = AutoModelForCausalLM.from_pretrained(path)
        weight = model.model.layers[0].mlp.up_proj.weight
        assert model.config.initializer_range == std
        assert abs(weight.std().item() - std) < 0.2 * std


def test_ensure_never_replaces_a_model_and_warns_about_a_stale_build(tmp_path, capsys):
    import json

    from roll.models.tiny import SPEC_FILE, ensure_tiny_model

    small = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=300,
        corpus=["a b c", "<answer>Up</answer>"],
    )
    path = ensure_tiny_model(tmp_path / "m", **small)
    assert json.loads((path / SPEC_FILE).read_text())["num_hidden_layers"] == 1
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    ensure_tiny_model(path, **small)  # same arguments: kept, nothing said
    assert "warning" not in capsys.readouterr().out

    ensure_tiny_model(path, **{**small, "num_hidden_layers": 2})  # other arguments: kept, the difference named
    out = capsys.readouterr().out
    assert "warning" in out and "num_hidden_layers: 1 there, 2 asked" in out and "Delete the directory" in out
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert AutoModelForCausalLM.from_pretrained(path).config.num_hidden_layers == 1

    (path / SPEC_FILE).unlink()  # no record: a user's model, used silently
    ensure_tiny_model(path, **{**small, "num_hidden_layers": 2})
    assert "warning" not in capsys.readouterr().out


def test_ensure_keeps_a_build_from_the_env_corpus(tmp_path, capsys):
    """No corpus given (the built-in envs' text): the second call finds the same build and keeps it."""
    from roll.models.tiny import ensure_tiny_model

    small = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=400,
    )
    path = ensure_tiny_model(tmp_path / "m", **small)
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    ensure_tiny_model(path, **small)
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert "warning" not in capsys.readouterr().out


def _build_small(path: str) -> str:
    from roll.models.tiny import ensure_tiny_model

    dims = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
    return str(ensure_tiny_model(path, vocab_size=300, **dims))


@pytest.mark.slow
def test_two_processes_building_the_same_tiny_model_both_get_it(tmp_path):
    """The README's command started twice at once: each process builds its own copy and renames it into place; the
    second rename loses and that process uses the first model (both built the same one). Before, both wrote the same
    scratch folder and one crashed saving its tokenizer."""
    import multiprocessing

    target = tmp_path / "tiny"
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        assert pool.map(_build_small, [str(target)] * 2) == [str(target)] * 2
    assert (target / "config.json").is_file() and (target / "tokenizer.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["tiny"]  # no scratch copy left behind
