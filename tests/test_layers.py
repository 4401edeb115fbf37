"""The import arrows of docs/DESIGN.md, checked: every `import` in cni/ (top level or inside a
function) must point along an allowed arrow. A new upward import fails here with its line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CNI = Path(__file__).resolve().parent.parent / "cni"
CONTRACT = {"contract"}
# layer -> the layers (or single modules) it may import, besides itself and the contract layer.
ALLOWED: dict[str, set[str]] = {
    "entry": {"fast", "runtime", "plugins", "ipam", "skel", "host", "entry"},
    "fast": {"skel", "host"},  # the shim's own imports are stdlib only: tests/test_shim.py
    "runtime": set(),
    "plugins": {"ipam", "host", "skel"},
    "ipam": {"host", "skel", "cni.runtime.invoke"},
    # plugload (skel's layer) walks a plugin's files by safedir's rule before skel imports it
    "skel": {"cni.host.errors", "cni.host.safewalk"},
    "host": set(),
    "contract": set(),
}
LAYER_OF_PACKAGE = {"cni.fast": "fast", "cni.runtime": "runtime", "cni.plugins": "plugins",
                    "cni.ipam": "ipam", "cni.host": "host", "cni.spec": "contract"}
LAYER_OF_MODULE = {"cni": "contract", "cni.registry": "contract", "cni.deleted": "contract",
                   "cni.skel": "skel", "cni.plugload": "skel"}


def layer(module: str) -> str:
    if module in LAYER_OF_MODULE:
        return LAYER_OF_MODULE[module]
    package = ".".join(module.split(".")[:2])
    return LAYER_OF_PACKAGE.get(package, "entry")


def module_name(path: Path) -> str:
    parts = path.relative_to(CNI.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import of a cni module; `from cni.x import y` counts as cni.x.y
    when y is a module, else as cni.x."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "cni"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] == "cni":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                is_module = (CNI.parent / (sub.replace(".", "/") + ".py")).exists() or \
                    (CNI.parent / sub.replace(".", "/")).is_dir()
                out.append((node.lineno, sub if is_module else node.module))
    return out


def allowed(source: str, target: str) -> bool:
    src, dst = layer(source), layer(target)
    if src == "host":  # the kernel layer knows nothing of CNI, not even its error codes
        return dst == "host"
    if dst == src or dst in CONTRACT:
        return src != "contract" or _contract_ok(source, target)
    return dst in ALLOWED[src] or any(target == m or target.startswith(m + ".")
                                      for m in ALLOWED[src] if m.startswith("cni."))


def _contract_ok(source: str, target: str) -> bool:
    """Within the contract layer: spec imports only spec (and cni for __version__)."""
    if source.startswith("cni.spec"):
        return target.startswith("cni.spec") or target == "cni"
    return True


def test_every_import_follows_an_arrow() -> None:
    bad = [f"{module_name(p)}:{line} imports {target} ({layer(module_name(p))} -> "
           f"{layer(target)})"
           for p in sorted(CNI.rglob("*.py")) for line, target in imports(p)
           if not allowed(module_name(p), target)]
    assert bad == [], "\n".join(bad)


@pytest.mark.parametrize("source,target,ok", [
    ("cni.skel", "cni.plugins.bridge", False),  # dispatch goes through cni.registry
    ("cni.skel", "cni.host.errors", True),
    ("cni.skel", "cni.host.netns", False),
    ("cni.host.veth", "cni.spec.errors", False),  # host knows nothing of CNI
    ("cni.runtime.chain", "cni.plugins.bridge", False),  # the runtime execs plugins
    ("cni.ipam.delegate", "cni.runtime.invoke", True),
    ("cni.ipam.delegate", "cni.runtime.chain", False),
    ("cni.spec.config", "cni.registry", False),
    ("cni.fast.shim", "cni.host.nsfd", True),
    ("cni.host.netns", "cni.host.nsfd", True),
    ("cni.fast.child", "cni.plugins.bridge", False),
    ("cni.cli", "cni.plugins.bridge", True),
])
def test_the_checker_itself(source, target, ok) -> None:
    assert allowed(source, target) is ok
