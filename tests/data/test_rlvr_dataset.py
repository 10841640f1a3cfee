"""Tests for roll.data.rlvr_dataset: loading, row validation errors, chat-template encoding, truncation."""

import json

import pandas as pd
import pytest

from roll.data.rlvr_dataset import DatasetValidationError, RLVRExample, encode_prompts, load_rlvr_dataset

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    """A word-level tokenizer built locally: one token per whitespace-separated word or special token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = "user assistant system be brief what is 1 2 3 4 + ?".split()
    specials = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = {tok: i for i, tok in enumerate(specials + words)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_load_jsonl_and_parquet(tmp_path):
    rows = [
        {"prompt": "what is 1 + 2 ?", "ground_truth": "3", "tag": "math"},
        {"prompt": "what is 2 + 2 ?", "ground_truth": 4, "tag": "math"},
    ]
    jl = _write_jsonl(tmp_path / "a.jsonl", rows)
    pq = tmp_path / "b.parquet"
    # a numeric parquet column: 3.0 and 2.5 become "3" and "2.5"
    pd.DataFrame({"prompt": ["what is 1 + 2 ?", "p"], "ground_truth": [3.0, 2.5], "tag": ["math", "x"]}).to_parquet(pq)
    examples = load_rlvr_dataset([jl, str(pq)])
    assert [(e.prompt, e.ground_truth, e.tag, e.row) for e in examples] == [
        ("what is 1 + 2 ?", "3", "math", 0),
        ("what is 2 + 2 ?", "4", "math", 1),
        ("what is 1 + 2 ?", "3", "math", 0),
        ("p", "2.5", "x", 1),
    ]
    assert examples[0].source == str(jl) and examples[3].source == str(pq)


def test_load_messages_column_from_parquet(tmp_path):
    pq = tmp_path / "chat.parquet"
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is 3 ?"}]
    pd.DataFrame([{"msgs": chat, "answer": "3", "domain": "math"}]).to_parquet(pq)
    (ex,) = load_rlvr_dataset(pq, messages_key="msgs", ground_truth_key="answer", tag_key="domain")
    assert ex.prompt == chat and ex.ground_truth == "3"


def test_malformed_rows_listed_in_one_error(tmp_path):
    rows = [
        {"prompt": "ok", "ground_truth": "1", "tag": "math"},  # row 0, line 1
        {"prompt": "  ", "ground_truth": "1", "tag": "math"},  # row 1: empty prompt
        "",  # blank line: skipped, not a row
        {"prompt": 5, "ground_truth": "1", "tag": "math"},  # row 2 (line 4): wrong type
        {"prompt": "ok", "tag": "math"},  # row 3: missing ground truth
        "{not json",  # row 4 (line 6)
        {"prompt": "ok", "ground_truth": "1", "tag": ""},  # row 5: empty tag
    ]
    path = _write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DatasetValidationError) as info:
        load_rlvr_dataset(path)
    msg = str(info.value)
    assert msg.startswith("5 malformed row(s)")
    assert f"{path} row 1 (line 2): empty prompt" in msg
    assert f"{path} row 2 (line 4): prompt must be text, got int" in msg
    assert f"{path} row 3 (line 5): missing ground_truth" in msg
    assert f"{path} row 4 (line 6): invalid JSON" in msg
    assert f"{path} row 5 (line 7): missing or empty tag ''" in msg
    assert "row 0" not in msg


def test_error_list_is_capped(tmp_path):
    path = _write_jsonl(tmp_path / "many.jsonl", [{"prompt": "", "ground_truth": "1", "tag": "m"}] * 25)
    with pytest.raises(DatasetValidationError) as info:
        load_rlvr_dataset(path)
    msg = str(info.value)
    assert "row 19 (line 20)" in msg and "row 20 " not in msg and msg.endswith("... and 5 more")


def test_missing_column_and_bad_files(tmp_path):
    path = _write_jsonl(tmp_path / "q.jsonl", [{"question": "q", "ground_truth": "1", "tag": "m"}])
    with pytest.raises(DatasetValidationError, match=r"column\(s\) \['prompt'\] not found.*'question'"):
        load_rlvr_dataset(path)
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_rlvr_dataset(tmp_path / "nope.jsonl")
    (tmp_path / "x.csv").write_text("a\n")
    with pytest.raises(ValueError, match=r"\.parquet or \.jsonl"):
        load_rlvr_dataset(tmp_path / "x.csv")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DatasetValidationError, match="holds no records"):
        load_rlvr_dataset(tmp_path / "empty.jsonl")


def _ex(prompt, row=0):
    return RLVRExample(prompt=prompt, ground_truth="0", tag="math", row=row, source="f.jsonl")


def test_encode_applies_chat_template(tokenizer):
    ids, report = encode_prompts([_ex("what is 1 + 2 ?")], tokenizer, prompt_length=32, system_prompt="be brief")
    expected = (
        "<|im_start|> system be brief <|im_end|> <|im_start|> user what is 1 + 2 ? <|im_end|> <|im_start|> assistant"
    )
    assert ids[0] == tokenizer.convert_tokens_to_ids(expected.split())
    assert report.kept == [0] and report.max_length == 16  # 5 + 9 + 2 tokens


def test_encode_keeps_existing_system_message(tokenizer):
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1"}]
    ids, _ = encode_prompts([_ex(chat)], tokenizer, prompt_length=32, system_prompt="what")
    assert tokenizer.convert_ids_to_tokens(ids[0])[:3] == ["<|im_start|>", "system", "be"]


def test_truncation_modes(tokenizer):
    # "1 2 3 4" -> <|im_start|> user 1 2 3 4 <|im_end|> <|im_start|> assistant: 9 tokens; "1" alone: 6 tokens
    examples = [_ex("1", row=0), _ex("1 2 3 4", row=7)]
    with pytest.raises(ValueError, match="f.jsonl row 7: prompt has 9 tokens, more than prompt_length=6"):
        encode_prompts(examples, tokenizer, prompt_length=6, truncation="error")
    left, report = encode_prompts(examples, tokenizer, prompt_length=6, truncation="left")
    assert tokenizer.convert_ids_to_tokens(left[1]) == ["2", "3", "4", "<|im_end|>", "<|im_start|>", "assistant"]
    assert report.truncated_rows == [("f.jsonl", 7, 9)] and report.kept == [0, 1]
    right, _ = encode_prompts(examples, tokenizer, prompt_length=6, truncation="right")
    assert tokenizer.convert_ids_to_tokens(right[1]) == ["<|im_start|>", "user", "1", "2", "3", "4"]
    kept, report = encode_prompts(
        examples, tokenizer, prompt_length=6, truncation="error", filter_overlong_prompts=True
    )
    assert len(kept) == 1 and report.kept == [0] and report.filtered_rows == [("f.jsonl", 7, 9)]
    with pytest.raises(ValueError, match="truncation='middle' is not one of"):
        encode_prompts(examples, tokenizer, prompt_length=6, truncation="middle")


def test_default_tag_for_rows_without_one(tmp_path):
    untagged = _write_jsonl(
        tmp_path / "untagged.jsonl",
        [{"prompt": "1 + 1 ?", "ground_truth": "2"}, {"prompt": "2 + 2 ?", "ground_truth": 4}],
    )
    with pytest.raises(DatasetValidationError, match=r"column\(s\) \['tag'\] not found.*default_tag="):
        load_rlvr_dataset(untagged)
    assert [e.tag for e in load_rlvr_dataset(untagged, default_tag="math")] == ["math", "math"]
    mixed = _write_jsonl(
        tmp_path / "mixed.jsonl",
        [
            {"prompt": "a", "ground_truth": "1", "tag": "logic"},
            {"prompt": "b", "ground_truth": "1", "tag": None},
            {"prompt": "c", "ground_truth": "1"},
        ],
    )
    assert [e.tag for e in load_rlvr_dataset(mixed, default_tag="math")] == ["logic", "math", "math"]
    with pytest.raises(DatasetValidationError, match=r"row 1 \(line 2\): missing or empty tag None \(default_tag"):
        load_rlvr_dataset(mixed)
    blank = _write_jsonl(tmp_path / "blank.jsonl", [{"prompt": "a", "ground_truth": "1", "tag": " "}])
    with pytest.raises(DatasetValidationError, match="missing or empty tag ' '"):  # a blank tag is an error
        load_rlvr_dataset(blank, default_tag="math")
