"""Kubernetes resource quantities ("10M", "1.5Gi", "500k", "1e6"), as kubelet reads them.

The bandwidth annotations (`kubernetes.io/ingress-bandwidth`, `.../egress-bandwidth`) are
quantities in bits per second. We follow apimachinery's grammar: an optional sign, a decimal
number, then one suffix: binary (Ki Mi Gi Ti Pi Ei), decimal (n u m "" k M G T P E) or a decimal
exponent (e3, E-2). Values are exact (Fraction); `value()` rounds up to an integer as
`Quantity.Value()` does, so "100m" is 1 and is then refused by the bandwidth bounds.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_NUMBER = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(.*)$")
_EXPONENT = re.compile(r"^[eE]([+-]?[0-9]+)$")
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


class QuantityError(ValueError):
    """The text is not a Kubernetes quantity."""


def parse(text: str) -> Fraction:
    """The exact value of a quantity string, or QuantityError."""
    if not isinstance(text, str) or text != text.strip() or not text:
        raise QuantityError("quantities must match the regular expression "
                            "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
    match = _NUMBER.match(text)
    if match is None:
        raise QuantityError("not a number with an optional unit suffix")
    number, suffix = Fraction(match.group(1)), match.group(2)
    return number * _multiplier(suffix)


def _multiplier(suffix: str) -> Fraction:
    if suffix in _BINARY:
        return Fraction(1024) ** _BINARY[suffix]
    if suffix in _DECIMAL:
        return Fraction(10) ** _DECIMAL[suffix]
    exp = _EXPONENT.match(suffix)
    if exp is not None and abs(int(exp.group(1))) <= 1000:
        return Fraction(10) ** int(exp.group(1))
    raise QuantityError(f"unknown unit suffix {suffix!r}")


def value(text: str) -> int:
    """The integer value rounded away from zero, as Quantity.Value() does."""
    exact = parse(text)
    return math.ceil(exact) if exact >= 0 else -math.ceil(-exact)
