"""Hand-computed checks of masked reductions and the registry helper."""

import math

import pytest
import torch

from roll.algorithms.masking import masked_mean, masked_sum, masked_var, masked_whiten
from roll.registry import Registry

NAN = float("nan")
# Masked values are 1, 2, 4, 6 (padding holds 3 and nan, which must not leak in).
X = torch.tensor([[1.0, 2.0, 3.0], [4.0, NAN, 6.0]])
M = torch.tensor([[1, 1, 0], [1, 0, 1]])


def test_masked_sum_and_mean():
    assert masked_sum(X, M).item() == 13.0
    assert masked_mean(X, M).item() == pytest.approx(3.25)  # 13 / 4
    torch.testing.assert_close(masked_mean(X, M, dim=-1), torch.tensor([1.5, 5.0]))  # (1+2)/2, (4+6)/2
    torch.testing.assert_close(masked_sum(X, M, dim=0), torch.tensor([5.0, 2.0, 6.0]))


def test_masked_mean_of_empty_mask_is_zero():
    assert masked_mean(X, torch.zeros_like(M)).item() == 0.0
    torch.testing.assert_close(masked_mean(X, torch.tensor([[0, 0, 0], [1, 0, 0]]), dim=-1), torch.tensor([0.0, 4.0]))


def test_masked_var():
    # deviations from 3.25: -2.25, -1.25, 0.75, 2.75; squares sum 14.75
    assert masked_var(X, M).item() == pytest.approx(14.75 / 3)
    assert masked_var(X, M, unbiased=False).item() == pytest.approx(14.75 / 4)
    assert masked_var(X, torch.tensor([[1, 0, 0], [0, 0, 0]])).item() == 0.0  # one element: no spread


def test_masked_whiten():
    x = torch.tensor([[1.0, 3.0, 50.0]])
    m = torch.tensor([[1, 1, 0]])
    # mean 2, unbiased var 2 -> (x - 2) / sqrt(2); padding -> 0
    s = 1 / math.sqrt(2.0)
    torch.testing.assert_close(masked_whiten(x, m), torch.tensor([[-s, s, 0.0]]))
    torch.testing.assert_close(masked_whiten(x, m, shift_mean=False), torch.tensor([[2 - s, 2 + s, 0.0]]))


def test_mask_shape_mismatch_is_explained():
    with pytest.raises(ValueError, match="mask shape"):
        masked_mean(X, torch.ones(2, 2))


def test_registry_duplicates_and_lookup():
    reg: Registry[int] = Registry("widget", "register_widget")
    reg.register("a", "alias")(1)
    assert reg.get("alias") == 1 and reg.names() == ["a", "alias"] and "a" in reg
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(2)
    with pytest.raises(KeyError, match=r"valid names: \['a', 'alias'\]"):
        reg.get("b")
    with pytest.raises(ValueError):
        reg.register()


def test_registry_capabilities_and_user_modules():
    reg: Registry[int] = Registry("widget", "register_widget", capabilities={"needs_x": False})
    reg.register("plain")(1)
    reg.register("special", needs_x=True)(2)
    assert reg.capabilities("plain") == {"needs_x": False} and reg.capabilities("special") == {"needs_x": True}
    with pytest.raises(ValueError, match=r"unknown capabilities \['needs_y'\]; a widget may declare \['needs_x'\]"):
        reg.register("typo", needs_y=True)
    with pytest.raises(ImportError, match="no_such_module_xyz"):
        reg.get("no_such_module_xyz:thing")
    with pytest.raises(KeyError, match="'package.module:missing'"):
        reg.get("json:missing")  # the module imports, but registers nothing of that name
