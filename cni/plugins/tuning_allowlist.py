"""tuning's sysctl allowlist, /etc/cni/tuning/allowlist.conf, read as the reference reads it.

The reference (validateSysctlConf) splits the file on newlines, trims each line and drops the
empty ones; then for each sysctl key, as written in the config, it tries the lines in order with
Go's regexp.MatchString (RE2 syntax, unanchored): the first line that matches admits the key, a
line that does not compile fails the ADD when it is reached, a key no line matches fails it with
the list. So the lines are RE2 here too (google-re2), never Python's `re`: `[[:alnum:]]`, `\\z`
and a lookahead mean the same on both sides of a binary swap, and errors read as Go prints them.

Root trusts only root: a list, or its directory, that others can write is not used (ADD refused).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from cni.spec.errors import CNIError, Code

if TYPE_CHECKING:
    from cni.plugins.tuning_conf import Settings

ALLOWLIST = "/etc/cni/tuning/allowlist.conf"

# RE2's error codes (re2/re2.cc CodeText) as Go's regexp/syntax names the same errors.
_GO_CODES = {
    "invalid character class range": "invalid character class range",
    "invalid character class": "invalid character class",
    "invalid escape sequence": "invalid escape sequence",
    "missing ]": "missing closing ]",
    "missing )": "missing closing )",
    "unexpected )": "unexpected )",
    "trailing \\": "trailing backslash at end of expression",
    "no argument for repetition operator": "missing argument to repetition operator",
    "invalid repetition size": "invalid repeat count",
    "bad repetition operator": "invalid nested repetition operator",
    "invalid perl operator": "invalid or unsupported Perl syntax",
    "invalid UTF-8": "invalid UTF-8",
    "invalid named capture group": "invalid named capture",
    "pattern too large - compile failed": "expression too large",
}


class PatternError(Exception):
    """A line Go's regexp would not compile; str() is Go's error text."""


def _go_error(code: str, arg: str) -> PatternError:
    return PatternError(f"error parsing regexp: {code}: `{arg}`")


def _refuse_byte_escape(pattern: str) -> None:
    r"""RE2 in C++ takes `\C` (any byte); Go's RE2 does not (invalid escape sequence)."""
    i = 0
    while i < len(pattern) - 1:
        if pattern[i] != "\\":
            i += 1
        elif pattern[i + 1] == "Q":  # \Q...\E is literal text
            end = pattern.find("\\E", i + 2)
            if end < 0:
                return
            i = end + 2
        elif pattern[i + 1] == "C":
            raise _go_error("invalid escape sequence", "\\C")
        else:
            i += 2


def compile_go(line: bytes):
    """The line as Go's regexp.Compile takes it (a compiled re2 pattern), else PatternError."""
    import re2  # only ADD with an allowlist present pays for the import

    try:
        pattern = line.decode("utf-8")
    except UnicodeDecodeError:
        raise _go_error("invalid UTF-8", line.decode("utf-8", "replace")) from None
    options = re2.Options()
    options.log_errors = False  # RE2 would print each bad line on stderr
    try:
        compiled = re2.compile(pattern, options)
    except re2.error as e:
        text = e.args[0].decode("utf-8", "replace") if isinstance(e.args[0], bytes) \
            else str(e.args[0])
        for code in sorted(_GO_CODES, key=len, reverse=True):
            if text == code or text.startswith(code + ": "):
                arg = "" if code == "trailing \\" else text[len(code) + 2:]
                raise _go_error(_GO_CODES[code], arg) from None
        raise PatternError(f"error parsing regexp: {text}") from None
    _refuse_byte_escape(pattern)
    return compiled


def match_string(line: bytes, key: str) -> bool:
    """Go's regexp.MatchString(line, key): a match anywhere in key; PatternError if the line
    does not compile."""
    return compile_go(line).search(key) is not None


def _read(path: str) -> list[bytes] | None:
    """The trimmed non-empty lines; None without a file (then nothing is checked)."""
    try:
        with open(path, "rb") as f:
            # a list others can write would widen what ADD takes
            for st in (os.fstat(f.fileno()), os.stat(os.path.dirname(path))):
                if st.st_uid != os.geteuid() or st.st_mode & 0o022:
                    raise CNIError(Code.INVALID_CONFIG, f"sysctl allowlist {path}: it or "
                                   "its directory is writable by others than root: not used "
                                   "(ADD refused)")
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CNIError(Code.IO_FAILURE, f"sysctl allowlist {path}: {e.strerror}") from None
    return [line for line in (raw.strip() for raw in data.split(b"\n")) if line]


def check(settings: Settings) -> None:
    """ADD only, as the reference: with the allowlist present, every key must match one of its
    lines. The msg is the reference's text, the file in details; the code is ours (7: the
    admin's list or the pod's config is refused; the reference answers 999 for both)."""
    lines = _read(ALLOWLIST)
    if lines is None:
        return
    for item in settings.sysctls:
        try:
            allowed = any(match_string(line, item.key) for line in lines)
        except PatternError as e:
            raise CNIError(Code.INVALID_CONFIG, str(e), f"sysctl allowlist {ALLOWLIST}") \
                from None
        if not allowed:
            listed = " ".join(line.decode("utf-8", "replace") for line in lines)
            raise CNIError(Code.INVALID_CONFIG, f"Sysctl {item.key} is not allowed. Only the "
                           f"following sysctls are allowed: [{listed}]",
                           f"sysctl allowlist {ALLOWLIST}; value {item.value!r}")
