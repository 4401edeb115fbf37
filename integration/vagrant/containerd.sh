#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# containerd with its CRI plugin reading pycni's dirs, then the crictl pod scenario. Without
# crictl (offline) our CRI client drives it, its sandbox image built offline (containerd_offline).
# Any previous /etc/containerd/config.toml is kept as config.toml.pycni-orig.
. "$(dirname "$0")/lib.sh"
log "containerd (CRI) with bin_dir=$BIN_DIR conf_dir=$CONF_DIR"
if command -v crictl >/dev/null; then
  containerd_config
  systemctl restart containerd
  wait_until 60 "containerd's CRI" crictl --runtime-endpoint unix:///run/containerd/containerd.sock info
else
  containerd_offline
fi
"$(dirname "$0")/crictl-pod.sh" unix:///run/containerd/containerd.sock
systemctl stop containerd
