#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# containerd with its CRI plugin reading pycni's dirs, then the crictl pod scenario.
# Any previous /etc/containerd/config.toml is kept as config.toml.pycni-orig.
. "$(dirname "$0")/lib.sh"
containerd_config
log "containerd (CRI) with bin_dir=$BIN_DIR conf_dir=$CONF_DIR"
systemctl restart containerd
wait_until 60 "containerd's CRI" crictl --runtime-endpoint unix:///run/containerd/containerd.sock info
"$(dirname "$0")/crictl-pod.sh" unix:///run/containerd/containerd.sock
systemctl stop containerd
