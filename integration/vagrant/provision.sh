#!/usr/bin/env bash
# Installs the node's software on Debian 12: containerd (CRI enabled) and runc from Debian,
# CRI-O and crictl (cri-tools) from the Kubernetes community repositories (pkgs.k8s.io), cnitool
# built from the CNI repository's release tag, and pycni's own setup (scripts/setup.sh).
# Idempotent. Run as root on the VM (Vagrantfile) or on any Debian 12 host.
set -euo pipefail
K8S_MINOR=${K8S_MINOR:-v1.30}
CNI_VERSION=${CNI_VERSION:-v1.1.2}
export DEBIAN_FRONTEND=noninteractive

apt-get update -qq
apt-get install -y -qq --no-install-recommends ca-certificates curl gnupg make python3 \
  python3-venv iproute2 nftables conntrack containerd runc golang-go git busybox-static >/dev/null

install -d -m 0755 /etc/apt/keyrings
add_repo() {  # add_repo NAME URL: a signed apt source from pkgs.k8s.io
  local name=$1 url=$2
  if [ ! -f "/etc/apt/keyrings/$name.gpg" ]; then
    curl -fsSL "$url/Release.key" | gpg --dearmor -o "/etc/apt/keyrings/$name.gpg"
  fi
  echo "deb [signed-by=/etc/apt/keyrings/$name.gpg] $url/ /" > "/etc/apt/sources.list.d/$name.list"
}
add_repo kubernetes "https://pkgs.k8s.io/core:/stable:/$K8S_MINOR/deb"
add_repo cri-o "https://pkgs.k8s.io/addons:/cri-o:/stable:/$K8S_MINOR/deb"
apt-get update -qq
apt-get install -y -qq --no-install-recommends cri-tools cri-o >/dev/null
# Both runtimes are started by the scenario, one at a time, with pycni's config.
systemctl disable --now crio containerd >/dev/null 2>&1 || true

if ! command -v cnitool >/dev/null; then
  GOBIN=/usr/local/bin GOFLAGS=-mod=mod go install \
    "github.com/containernetworking/cni/cnitool@$CNI_VERSION"
fi

# Kubernetes' usual node settings (the bridge plugin itself turns ip_forward on).
modprobe br_netfilter || true
modprobe ifb || true
# PYCNI_TEST_PACKAGES narrows setup.sh to what a node needs (the VM sets busybox-static).
"$(cd "$(dirname "$0")/../.." && pwd)/scripts/setup.sh"
