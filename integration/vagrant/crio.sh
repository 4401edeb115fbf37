#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# CRI-O reading pycni's dirs and defaulting to its network, then the crictl pod scenario.
. "$(dirname "$0")/lib.sh"
install -d /etc/crio/crio.conf.d
cat > /etc/crio/crio.conf.d/90-pycni.conf <<TOML
[crio.network]
cni_default_network = "$NETWORK"
network_dir = "$CONF_DIR/"
plugin_dirs = ["$BIN_DIR/"]
TOML
log "CRI-O with network_dir=$CONF_DIR plugin_dirs=$BIN_DIR default network $NETWORK"
systemctl restart crio
wait_until 60 "CRI-O" crictl --runtime-endpoint unix:///var/run/crio/crio.sock info
"$(dirname "$0")/crictl-pod.sh" unix:///var/run/crio/crio.sock
systemctl stop crio
