# Shared helpers for the VM scenario scripts (sourced, not run). Plain bash: every script here
# runs the same on the Vagrant VM and directly on a Debian host, as root.
# shellcheck disable=SC2034  # the settings below are for the scripts that source this file
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN_DIR=${PYCNI_BIN_DIR:-/opt/cni/bin}
CONF_DIR=${PYCNI_CONF_DIR:-/etc/cni/net.d}
CONFLIST=${PYCNI_CONFLIST:-10-pycni.conflist}
NETWORK=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["name"])' \
  "$ROOT/conf/$CONFLIST")
HOSTPORT=${PYCNI_HOSTPORT:-8080}
TEST_IMAGE=${PYCNI_TEST_IMAGE:-docker.io/library/busybox:1.36}
CNITOOL=${CNITOOL:-cnitool}  # `pycni` takes cnitool's arguments and environment too

# The pycni the node runs: PYCNI_VENV names the venv it was installed into from its wheel (the
# VM's node: /opt/pycni-venv); the checkout's .venv by default. (The checkout's .venv also runs
# the test clients below: it has the dev tools.)
PYCNI_VENV=${PYCNI_VENV:-$ROOT/.venv}
pycni() { "$PYCNI_VENV/bin/pycni" "$@"; }

log() { printf '\n==> %s\n' "$*"; }
die() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

# wait_until SECONDS DESCRIPTION COMMAND...: poll COMMAND every half second, bounded.
wait_until() {
  local limit=$1 what=$2 deadline
  shift 2
  deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || die "timed out after ${limit}s waiting for $what"
    sleep 0.5
  done
}

# The node's own address: hostPorts are checked against it, as a client off the node would.
node_ip() {
  [ -n "${PYCNI_NODE_IP:-}" ] && { echo "$PYCNI_NODE_IP"; return; }
  ip -4 -o route get 1.1.1.1 | sed -n 's/.* src \([0-9.]*\).*/\1/p'
}

# leftovers ID: what an attachment could leave behind; prints each, fails if any.
leftovers() {
  local id=$1 found=0 f
  for f in /var/lib/cni/networks/"$NETWORK"/*; do
    [ -e "$f" ] || continue
    case ${f##*/} in lock|last_reserved_ip.*) continue ;; esac
    grep -q "$id" "$f" && { echo "leftover reservation $f"; found=1; }
  done
  if nft list ruleset 2>/dev/null | grep "$id" >/dev/null; then echo "leftover nft rule for $id"; found=1; fi
  for f in /var/lib/cni/results/*"$id"*; do
    [ -e "$f" ] && { echo "leftover cached result $f"; found=1; }
  done
  [ "$found" = 0 ] || die "attachment $id left state behind"
}

# The tbf qdisc the bandwidth plugin put on some interface, at RATE (tc's spelling, e.g. 1Mbit).
has_tbf() { tc qdisc show | grep "tbf .*rate $1" >/dev/null; }  # not -q: an early exit SIGPIPEs tc under pipefail

# containerd_config: /etc/containerd/config.toml with the CRI plugin reading pycni's dirs
# (docs/kubernetes.md, section 3); sandbox image PYCNI_SANDBOX_IMAGE (default pause:3.9). Any
# previous config is kept as config.toml.pycni-orig. Restart containerd after.
containerd_config() {
  local cfg=/etc/containerd/config.toml
  install -d /etc/containerd
  if [ -f "$cfg" ] && [ ! -f "$cfg.pycni-orig" ]; then cp -p "$cfg" "$cfg.pycni-orig"; fi
  cat > "$cfg" <<TOML
version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "${PYCNI_SANDBOX_IMAGE:-registry.k8s.io/pause:3.9}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$BIN_DIR"
    conf_dir = "$CONF_DIR"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = true
TOML
}

# cri ARGS...: kubelet's CRI calls to CRI_SOCKET (default containerd's) by our CRI client
# (integration/cri), where there is no crictl; run, ip and rm print JSON.
cri() {
  (cd "$ROOT" && .venv/bin/python -m integration.cri.client \
    --socket "${CRI_SOCKET:-/run/containerd/containerd.sock}" "$@")
}
json_key() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$@"; }

# Images built offline from Debian's busybox-static (integration/clients.py, buildah from
# scratch): a node without a registry pulls nothing. The sandbox image runs clients.PAUSE_CMD
# (it exits on SIGTERM, as the real pause does).
OFFLINE_PAUSE=localhost/pycni-pause:test
OFFLINE_BUSYBOX=localhost/pycni-busybox:test
# offline_image REF [CMD...]: built and imported into containerd's CRI namespace (k8s.io), or
# into CRI-O's image store when OFFLINE_STORE=crio; without CMD, the sandbox image's.
offline_image() {
  local ref=$1 work archive id
  shift
  work=$(mktemp -d)
  archive=$(cd "$ROOT/integration" && "$ROOT/.venv/bin/python" -c 'import sys
from pathlib import Path
import clients
cmd = tuple(sys.argv[3:]) or clients.PAUSE_CMD
print(clients.build_image(Path(sys.argv[1]), sys.argv[2], cmd=cmd))' \
    "$work" "$ref" "$@")
  if [ "${OFFLINE_STORE:-containerd}" = crio ]; then
    id=$(crio_buildah pull -q "oci-archive:$archive")
    crio_buildah tag "$id" "$ref"
  else
    ctr -n k8s.io images import "$archive" >/dev/null
  fi
  rm -rf "$work"
}

# CRI-O: its socket, and buildah on its image store (containers/storage's default root with
# the overlay driver, as crio_offline_config sets it): an image put there is one CRI-O has.
CRIO_SOCKET=/var/run/crio/crio.sock
crio_buildah() {
  BUILDAH_ISOLATION=chroot buildah --root /var/lib/containers/storage \
    --runroot /run/containers/storage --storage-driver overlay "$@"
}

# containerd_offline: the node's containerd with containerd_config's CRI on pycni's dirs, its
# sandbox image OFFLINE_PAUSE imported, and its CRI answering.
containerd_offline() {
  PYCNI_SANDBOX_IMAGE=$OFFLINE_PAUSE containerd_config
  systemctl restart containerd
  wait_until 60 "containerd's CRI" cri version
  offline_image "$OFFLINE_PAUSE"
}
