"""The CNI error type and the spec's well-known codes."""

from __future__ import annotations

import json
from enum import IntEnum


class Code(IntEnum):
    UNKNOWN = 0
    INCOMPATIBLE_VERSION = 1
    UNSUPPORTED_FIELD = 2
    UNKNOWN_CONTAINER = 3
    INVALID_ENV = 4
    IO_FAILURE = 5
    DECODING_FAILURE = 6
    INVALID_CONFIG = 7
    INVALID_NETNS = 8
    TRY_AGAIN_LATER = 11
    NOT_AVAILABLE = 50
    LIMITED_CONNECTIVITY = 51
    INTERNAL = 999


class CNIError(Exception):
    """An error a plugin reports to its runtime: printed as JSON on stdout, exit 1."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code = int(code)
        self.msg = msg
        self.details = details

    def to_dict(self, cni_version: str) -> dict:
        return {"cniVersion": cni_version, "code": self.code, "msg": self.msg,
                "details": self.details}

    def to_json(self, cni_version: str) -> str:
        return json.dumps(self.to_dict(cni_version), indent=4)

    def __str__(self) -> str:
        return f"{self.msg}; {self.details}" if self.details else self.msg

    def __repr__(self) -> str:
        return f"CNIError({self.code}, {self.msg!r}, {self.details!r})"


def invalid_config(key: str, value: object, why: str) -> CNIError:
    """Code 7 naming the key and the value: the shape every config error takes."""
    return CNIError(Code.INVALID_CONFIG, f"invalid {key} {json.dumps(value, default=str)}: {why}")


def unsupported(key: str, value: object, why: str = "not supported") -> CNIError:
    return CNIError(Code.UNSUPPORTED_FIELD,
                    f"unsupported {key} {json.dumps(value, default=str)}: {why}")
