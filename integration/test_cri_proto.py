"""Our CRI proto subset against upstream's: the wire format is the field numbers, so every
message, field, enum value and RPC we declare must be upstream's, number for number and type for
type. (No root needed; skipped where the upstream copy is not beside the checkout.)"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from rootskips import missing

ROOT = Path(__file__).resolve().parent.parent
OURS = ROOT / "integration" / "cri" / "runtime_v1.proto"
UPSTREAM = [base / "shared" / "reference" / "cri-api-v1.proto"
            for base in (ROOT.parent, ROOT.parent.parent)]
FIELD = re.compile(r"^(repeated\s+)?(map<[^>]+>|[\w.]+)\s+(\w+)\s*=\s*(\d+)")
ENUM_VALUE = re.compile(r"^(\w+)\s*=\s*(-?\d+)")
RPC = re.compile(r"^rpc\s+(\w+)\s*\((stream\s+)?(\w+)\)\s*returns\s*\((stream\s+)?(\w+)\)")
BLOCK = re.compile(r"^(message|enum|service)\s+(\w+)\s*\{")


def parse(text: str) -> dict[str, dict[str, str]]:
    """{"message Foo": {"bar": "repeated string = 3"}, "enum E": {...}, "service S": {...}}."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    out: dict[str, dict[str, str]] = {}
    stack: list[tuple[str, str]] = []
    for raw in text.splitlines():
        line = raw.split("//")[0].strip()
        if not line:
            continue
        if m := BLOCK.match(line):
            stack.append((m[1], ".".join([n for _, n in stack] + [m[2]])))
            out.setdefault(f"{m[1]} {stack[-1][1]}", {})
            line = line[m.end():].strip()
        if not stack:
            continue
        kind, name = stack[-1]
        block = out[f"{kind} {name}"]
        if kind == "service" and (m := RPC.match(line)):
            block[m[1]] = f"{m[2] or ''}{m[3]} -> {m[4] or ''}{m[5]}"
        elif kind == "message" and (m := FIELD.match(line)) and m[2] not in ("option",):
            block[m[3]] = f"{(m[1] or '').strip()} {m[2].replace(' ', '')} = {m[4]}".strip()
        elif kind == "enum" and (m := ENUM_VALUE.match(line)):
            block[m[1]] = m[2]
        for _ in range(line.count("}") - line.count("{")):
            if stack:
                stack.pop()
    return out


def upstream() -> dict[str, dict[str, str]]:
    for path in UPSTREAM:
        if path.exists():
            return parse(path.read_text())
    missing("the upstream CRI proto, ../shared/reference/cri-api-v1.proto (../shared "
            "provides it)")


def test_every_declaration_is_upstreams_number_for_number() -> None:
    theirs, ours = upstream(), parse(OURS.read_text())
    assert "message PodSandboxConfig" in ours and "service RuntimeService" in ours
    wrong = []
    for block, members in ours.items():
        if block not in theirs:
            wrong.append(f"{block}: not upstream")
            continue
        for name, decl in members.items():
            if theirs[block].get(name) != decl:
                wrong.append(f"{block}.{name}: ours {decl!r}, upstream "
                             f"{theirs[block].get(name)!r}")
    assert wrong == []


def test_the_parser_sees_upstreams_numbers() -> None:
    """The comparison above is only as good as the parser: spot-check it on upstream."""
    theirs = upstream()
    assert theirs["message PodSandboxConfig"]["port_mappings"] == "repeated PortMapping = 5"
    assert theirs["message PodSandboxConfig"]["annotations"] == "map<string,string> = 7"
    assert theirs["message LinuxSandboxSecurityContext"]["run_as_group"] == "Int64Value = 8"
    assert theirs["enum SecurityProfile.ProfileType"]["Localhost"] == "2"
    assert theirs["service RuntimeService"]["RunPodSandbox"] == \
        "RunPodSandboxRequest -> RunPodSandboxResponse"
    assert theirs["service RuntimeService"]["GetContainerEvents"] == \
        "GetEventsRequest -> stream ContainerEventResponse"


def test_the_generated_stubs_call_upstreams_method_paths() -> None:
    """gRPC routes by "/runtime.v1.RuntimeService/RunPodSandbox": package and service names
    must be upstream's too, and the stubs must build from the proto (grpcio-tools)."""
    try:
        import grpc_tools  # noqa: F401
    except ImportError:
        missing("grpc_tools (grpcio-tools, the dev extras scripts/setup.sh installs)")
    sys.path.insert(0, str(ROOT / "integration"))
    from cri import stubs

    pb, _ = stubs.load()
    service = pb.DESCRIPTOR.services_by_name["RuntimeService"]
    assert service.full_name == "runtime.v1.RuntimeService"
    assert service.methods_by_name["RunPodSandbox"].input_type.full_name == \
        "runtime.v1.RunPodSandboxRequest"
    config = pb.PodSandboxConfig(port_mappings=[pb.PortMapping(host_port=8080)])
    assert config.SerializeToString() == b"\x2a\x03\x18\x90\x3f"  # field 5 { field 3: 8080 }
