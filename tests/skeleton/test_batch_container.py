"""The Batch container: sizes must agree; select/split/chunk/concat keep samples aligned."""

import pytest
import torch

from roll.data.batch import Batch


def make(n=5, width=3):
    return Batch(
        {"x": torch.arange(n * width).view(n, width), "s": torch.arange(n).float()},
        {"tag": [f"t{i}" for i in range(n)]},
    )


def test_mismatched_sizes_raise():
    with pytest.raises(ValueError, match="batch size"):
        Batch({"x": torch.zeros(3, 2)}, {"tag": ["a", "b"]})
    b = make()
    with pytest.raises(ValueError, match="has batch size 2"):
        b["y"] = torch.zeros(2)


def test_select_split_chunk_concat():
    b = make()
    sel = b.select([4, 0])
    assert sel["tag"] == ["t4", "t0"] and sel["s"].tolist() == [4.0, 0.0]
    assert [len(p) for p in b.split(2)] == [2, 2, 1]
    assert [len(p) for p in b.chunk(2)] == [2, 3] or [len(p) for p in b.chunk(2)] == [3, 2]
    parts = b.chunk(3)
    again = Batch.concat(parts)
    assert torch.equal(again["x"], b["x"]) and again["tag"] == b["tag"]


def test_concat_pads_narrower_rows_with_zeros():
    a = Batch({"x": torch.ones(1, 2, dtype=torch.long)})
    c = Batch({"x": torch.ones(1, 4, dtype=torch.long)})
    out = Batch.concat([a, c])
    assert out["x"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
