#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Usage: crio-binaries.sh DIR
# CRI-O from the binaries `crio` and `pinns` in DIR (the project's shared/reference/bin: CRI-O
# 1.33.5, built against Debian 12's libseccomp2 and libsqlite3-0), for a node where CRI-O's
# package repository is unreachable (provision.sh) and for `make vm-test`'s node, which has no
# network for packages. Needs Debian's conmon, runc and buildah. Idempotent; leaves crio stopped.
#
# What the package would bring is written here: /usr/local/bin/{crio,pinns}, a crio.service, a
# config drop-in (runc as the runtime, Debian's conmon, the systemd cgroup manager: the node has
# systemd as PID 1 and CRI-O runs pods in its slices), an accept-anything signature policy, and
# the pause image built offline into CRI-O's image store (nothing can be pulled: no registry).
. "$(dirname "$0")/lib.sh"
src=${1:?directory with crio and pinns}
for f in crio pinns; do
  [ -x "$src/$f" ] || die "no executable $src/$f"
  install -m 0755 "$src/$f" "/usr/local/bin/$f.new"
  mv -f "/usr/local/bin/$f.new" "/usr/local/bin/$f"  # atomic: a running crio keeps its file
done
for tool in conmon runc buildah; do
  command -v "$tool" >/dev/null || die "CRI-O needs Debian's $tool"
done
install -d /etc/crio/crio.conf.d /etc/containers
cat > /etc/crio/policy.json <<'JSON'
{"default": [{"type": "insecureAcceptAnything"}]}
JSON
cat > /etc/crio/crio.conf.d/10-binaries.conf <<TOML
# written by pycni's integration/vagrant/crio-binaries.sh
[crio]
root = "/var/lib/containers/storage"
runroot = "/run/containers/storage"
storage_driver = "overlay"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "systemd"
pinns_path = "/usr/local/bin/pinns"

[crio.runtime.runtimes.runc]
runtime_path = "$(command -v runc)"
runtime_type = "oci"
runtime_root = "/run/runc"
monitor_path = "$(command -v conmon)"
monitor_cgroup = "system.slice"

[crio.image]
pause_image = "$OFFLINE_PAUSE"
# "": the pause image's own command (clients.PAUSE_CMD: busybox sleeping until SIGTERM)
pause_command = ""
signature_policy = "/etc/crio/policy.json"
TOML
cat > /etc/systemd/system/crio.service <<UNIT
# written by pycni's integration/vagrant/crio-binaries.sh (CRI-O's own unit, abridged)
[Unit]
Description=Container Runtime Interface for OCI (CRI-O, from $src)
After=network-online.target

[Service]
Type=notify
ExecStart=/usr/local/bin/crio
ExecReload=/bin/kill -s HUP \$MAINPID
TasksMax=infinity
LimitNOFILE=1048576
LimitNPROC=1048576
LimitCORE=infinity
OOMScoreAdjust=-999
TimeoutStartSec=0
Restart=on-failure
RestartSec=10

[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload
systemctl stop crio 2>/dev/null || true
# The pause image, straight into CRI-O's store while it is stopped (the kubelet's sandbox image
# would be pulled from a registry; this node has none).
OFFLINE_STORE=crio offline_image "$OFFLINE_PAUSE"
echo "crio-binaries: $(/usr/local/bin/crio --version | head -n1 | tr -s ' ')," \
  "pause image $OFFLINE_PAUSE in CRI-O's store"
