"""``torch_xla.backends.set_mat_mul_precision`` sets torch's float32 matmul precision, which spmdtorch follows."""

from __future__ import annotations

import pytest
import torch

import spmdtorch


@pytest.fixture(autouse=True)
def _restore_precision():
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


@pytest.mark.parametrize(("name", "torch_name"), [("default", "medium"), ("high", "high"), ("highest", "highest")])
def test_set_and_get(name, torch_name):
    import torch_xla.backends

    torch_xla.backends.set_mat_mul_precision(name)
    assert torch.get_float32_matmul_precision() == torch_name
    assert torch_xla.backends.get_mat_mul_precision() == name


def test_reaches_the_program():
    import torch_xla.backends

    a = torch.randn(4, 4).to("xla")
    torch_xla.backends.set_mat_mul_precision("default")
    assert "precision = [DEFAULT, DEFAULT]" in spmdtorch.debug.get_stablehlo([a @ a])


def test_bad_name_is_named():
    import torch_xla.backends

    with pytest.raises(spmdtorch.ArgumentError, match=r"precision='bf16'.*'default', 'high', 'highest'"):
        torch_xla.backends.set_mat_mul_precision("bf16")
    assert torch.get_float32_matmul_precision() == "highest"  # unchanged
