"""Kubernetes quantities as kubelet reads the bandwidth annotations (no root needed)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from cni.plugins import quantity


@pytest.mark.parametrize(("text", "bits"), [
    ("1M", 1_000_000), ("10M", 10_000_000), ("500k", 500_000), ("1G", 10**9),
    ("10Mi", 10 * 1024**2), ("1Ki", 1024), ("1.5M", 1_500_000), ("1e6", 10**6),
    ("2E3", 2000), ("100", 100), ("+5k", 5000), (".5k", 500), ("1P", 10**15),
    ("100m", 1),  # 0.1 rounds up to 1, as Quantity.Value() does
    ("1500m", 2), ("-1M", -1_000_000), ("1n", 1),
])
def test_values(text: str, bits: int) -> None:
    assert quantity.value(text) == bits


def test_exact_fractions() -> None:
    assert quantity.parse("100m") == Fraction(1, 10)
    assert quantity.parse("1.25Gi") == Fraction(5, 4) * 1024**3


@pytest.mark.parametrize("text", [
    "fast", "", " 1M", "1M ", "1K", "1 M", "M", "1MB", "1.2.3", "0x10", "1e", "1Mi5", "--1",
])
def test_rejected(text: str) -> None:
    with pytest.raises(quantity.QuantityError):
        quantity.parse(text)


def test_non_string_is_rejected() -> None:
    with pytest.raises(quantity.QuantityError):
        quantity.parse(10)  # type: ignore[arg-type]
