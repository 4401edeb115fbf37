#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# containerd with its CRI plugin reading pycni's dirs, then the crictl pod scenario.
# Any previous /etc/containerd/config.toml is kept as config.toml.pycni-orig.
. "$(dirname "$0")/lib.sh"
cfg=/etc/containerd/config.toml
install -d /etc/containerd
[ -f "$cfg" ] && [ ! -f "$cfg.pycni-orig" ] && cp -p "$cfg" "$cfg.pycni-orig"
cat > "$cfg" <<TOML
version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.9"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$BIN_DIR"
    conf_dir = "$CONF_DIR"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = true
TOML
log "containerd (CRI) with bin_dir=$BIN_DIR conf_dir=$CONF_DIR"
systemctl restart containerd
wait_until 60 "containerd's CRI" crictl --runtime-endpoint unix:///run/containerd/containerd.sock info
"$(dirname "$0")/crictl-pod.sh" unix:///run/containerd/containerd.sock
systemctl stop containerd
