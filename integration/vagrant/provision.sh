#!/usr/bin/env bash
# Installs the node's software on Debian 12: containerd (CRI enabled) and runc from Debian,
# CRI-O and crictl (cri-tools) from the Kubernetes community repositories (pkgs.k8s.io), cnitool
# built from the CNI repository's release tag, and pycni's own setup (scripts/setup.sh).
# Idempotent. Run as root on the VM (Vagrantfile) or on any Debian 12 host.
#
# Offline, it takes what it cannot reach from what is there (each choice is printed):
# - Debian packages: apt runs only for packages missing (the local box has them all);
# - the Kubernetes repositories unreachable: no crictl (our CRI client, integration/cri, drives
#   the runtimes), and CRI-O from the binaries in /opt/crio-bin (the project's
#   shared/reference/bin, synced there by the Vagrantfile; crio-binaries.sh) when they are
#   there, else no CRI-O (run-all.sh skips it);
# - Go's module proxy unreachable: our cnitool (integration/cnitool, Debian's libcni);
# - Python packages from the wheelhouse /opt/wheelhouse when there is one (the Vagrantfile syncs
#   build/vm/wheelhouse there), else from the package index.
set -euo pipefail
K8S_MINOR=${K8S_MINOR:-v1.30}
CNI_VERSION=${CNI_VERSION:-v1.1.2}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export DEBIAN_FRONTEND=noninteractive
say() { printf 'provision: %s\n' "$*"; }
CRIO_BIN=${PYCNI_CRIO_BIN:-/opt/crio-bin}  # crio and pinns, for when the repository is unreachable

# only what is missing, so that a node that has everything needs no mirror
apt_install() { "$ROOT/scripts/apt-install.sh" "$@" | sed 's/^/provision: /'; }
installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }
# A short timeout: offline, the answer is a refused or unroutable connection or silence.
reachable() { curl -fsS --max-time 5 --retry 0 -o /dev/null "$1" 2>/dev/null; }

# buildah builds the offline images of the scenario's containerd pods (no crictl, no registry).
apt_install ca-certificates curl python3 python3-venv iproute2 nftables conntrack containerd \
  runc golang-go golang-github-appc-cni-dev busybox-static buildah

k8s_core="https://pkgs.k8s.io/core:/stable:/$K8S_MINOR/deb"
k8s_crio="https://pkgs.k8s.io/addons:/cri-o:/stable:/$K8S_MINOR/deb"
add_repo() {  # add_repo NAME URL: a signed apt source from pkgs.k8s.io
  local name=$1 url=$2
  if [ ! -f "/etc/apt/keyrings/$name.gpg" ]; then
    curl -fsSL "$url/Release.key" | gpg --dearmor -o "/etc/apt/keyrings/$name.gpg"
  fi
  echo "deb [signed-by=/etc/apt/keyrings/$name.gpg] $url/ /" > "/etc/apt/sources.list.d/$name.list"
}
if installed cri-tools && installed cri-o; then
  say "CRI-O and crictl installed"
elif reachable "$k8s_core/Release.key" && reachable "$k8s_crio/Release.key"; then
  apt_install gnupg
  install -d -m 0755 /etc/apt/keyrings
  add_repo kubernetes "$k8s_core"
  add_repo cri-o "$k8s_crio"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends cri-tools cri-o >/dev/null
  say "CRI-O and crictl from the Kubernetes repositories ($K8S_MINOR)"
elif [ -x "$CRIO_BIN/crio" ] && [ -x "$CRIO_BIN/pinns" ]; then
  apt_install conmon libseccomp2 libsqlite3-0
  crio_binaries=1  # installed below, once setup.sh made the venv that builds its pause image
  say "the Kubernetes repositories are unreachable: CRI-O from $CRIO_BIN, no crictl (our" \
    "client, integration/cri, drives the runtimes)"
else
  say "the Kubernetes repositories are unreachable: no CRI-O (nor its binaries in $CRIO_BIN)," \
    "no crictl (containerd's CRI is driven by our client, integration/cri)"
fi
# Both runtimes are started by the scenario, one at a time, with pycni's config.
systemctl disable --now crio containerd >/dev/null 2>&1 || true

if command -v cnitool >/dev/null; then
  say "cnitool: $(command -v cnitool)"
else
  # the first proxy Go itself would ask (GOPROXY is a list; "off" and "direct" are no proxy)
  proxy=$(go env GOPROXY | cut -d, -f1 | cut -d'|' -f1)
  if [ "$proxy" != off ] && [ "$proxy" != direct ] \
    && reachable "$proxy/github.com/containernetworking/cni/@v/$CNI_VERSION.info"; then
    GOBIN=/usr/local/bin GOFLAGS=-mod=mod go install \
      "github.com/containernetworking/cni/cnitool@$CNI_VERSION"
    say "cnitool $CNI_VERSION from Go's module proxy"
  else
    "$ROOT/integration/cnitool/build.sh" /usr/local/bin/cnitool
    say "Go's module proxy is unreachable: our cnitool (integration/cnitool) over Debian's libcni"
  fi
fi

# Kubernetes' usual node settings (the bridge plugin itself turns ip_forward on).
modprobe br_netfilter || true
modprobe ifb || true
wheelhouse=${PYCNI_WHEELHOUSE:-/opt/wheelhouse}
if compgen -G "$wheelhouse/*.whl" >/dev/null; then
  export PYCNI_WHEELHOUSE=$wheelhouse
  say "Python packages from the wheelhouse $wheelhouse"
fi
# PYCNI_TEST_PACKAGES narrows setup.sh to what a node needs (the VM sets busybox-static).
"$ROOT/scripts/setup.sh"
if [ -n "${crio_binaries:-}" ]; then
  bash "$ROOT/integration/vagrant/crio-binaries.sh" "$CRIO_BIN" | sed 's/^/provision: /'
fi
