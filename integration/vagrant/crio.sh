#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# CRI-O reading pycni's dirs and defaulting to its network, then the crictl pod scenario. Without
# crictl (offline: CRI-O from crio-binaries.sh) our CRI client drives it, with its images built
# offline into CRI-O's store (OFFLINE_STORE=crio).
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
if command -v crictl >/dev/null; then
  wait_until 60 "CRI-O" crictl --runtime-endpoint "unix://$CRIO_SOCKET" info
else
  export CRI_SOCKET=$CRIO_SOCKET OFFLINE_STORE=crio
  wait_until 60 "CRI-O's CRI" cri version
fi
"$(dirname "$0")/crictl-pod.sh" "unix://$CRIO_SOCKET"
systemctl stop crio
