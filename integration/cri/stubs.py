"""The Python stubs of runtime_v1.proto, generated with grpcio-tools on first use.

Generated code is never committed: it goes to a cache dir keyed by the proto's hash (build/ of
the checkout, gitignored; or $PYCNI_CRI_STUBS; or a temp dir when the checkout is read-only), so
editing the proto regenerates it and two checkouts never share stale stubs.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

PROTO = Path(__file__).resolve().with_name("runtime_v1.proto")
BUILD = Path(__file__).resolve().parents[2] / "build" / "cri-stubs"


def _cache_dir() -> Path:
    digest = hashlib.sha256(PROTO.read_bytes()).hexdigest()[:16]
    base = Path(os.environ.get("PYCNI_CRI_STUBS") or BUILD)
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError:  # read-only checkout (a VM's synced folder): a private temp dir
        base = Path(tempfile.gettempdir()) / f"pycni-cri-stubs-{os.getuid()}"
        base.mkdir(mode=0o700, exist_ok=True)
    return base / digest


def _generate(out: Path) -> None:
    from grpc_tools import protoc  # dev extra: grpcio-tools

    # Write into a sibling temp dir and rename: concurrent first uses never see half a module.
    tmp = Path(tempfile.mkdtemp(prefix=".gen-", dir=out.parent))
    args = ["protoc", f"-I{PROTO.parent}", f"--python_out={tmp}", f"--grpc_python_out={tmp}",
            str(PROTO)]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTO}")
    try:
        tmp.rename(out)
    except OSError:  # someone else won the race; theirs is the same
        shutil.rmtree(tmp, ignore_errors=True)


def load() -> tuple[ModuleType, ModuleType]:
    """(runtime_v1_pb2, runtime_v1_pb2_grpc), generating them if this proto is new."""
    out = _cache_dir()
    if not (out / "runtime_v1_pb2_grpc.py").exists():
        _generate(out)
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))  # the _grpc module imports runtime_v1_pb2 by that name
    return importlib.import_module("runtime_v1_pb2"), importlib.import_module("runtime_v1_pb2_grpc")
