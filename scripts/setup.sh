#!/usr/bin/env bash
# Installs what pycni needs on a Debian host, idempotently: the apt packages the plugins and
# tests use, then a venv in .venv with the project and its dev tools. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

# python3 + python3-venv: the venv is made from the distro's interpreter (below).
APT_RUNTIME="python3 python3-venv iproute2 nftables libnftables1 conntrack kmod"
# Real clients for integration/: containerd + runc (ctr run --cni), podman (CNI backend) with
# buildah for the offline images (and mmdebstrap: make image's rootfs), iptables for the
# reference portmap in the differential test, Go and Debian's libcni to build our cnitool
# (integration/cnitool).
# conmon, libseccomp2 and libsqlite3-0 for CRI-O (../shared/reference/bin/crio) in test_crio.py.
# bird2: BGP between the nodes of `make cluster-test` (the test starts its own, per node).
APT_TEST="containernetworking-plugins iperf3 busybox-static procps psmisc iputils-ping ncat
  containerd runc podman buildah mmdebstrap iptables curl util-linux golang-go
  golang-github-appc-cni-dev prometheus conmon libseccomp2 libsqlite3-0 bird2"
# shellcheck disable=SC2086
scripts/apt-install.sh $APT_RUNTIME ${PYCNI_TEST_PACKAGES:-$APT_TEST} | sed 's/^/setup: /'
# Installing bird2 starts a BIRD in the machine's own network namespace: the tests never use it.
if command -v systemctl >/dev/null && systemctl is-enabled bird >/dev/null 2>&1; then
  systemctl disable --now bird >/dev/null 2>&1 || true
fi

# The distro's interpreter by default, not whichever python3 comes first on PATH: every plugin
# exec starts it, and Debian's (static, PGO+LTO) starts in ~7.7 ms where a default source build
# (pyenv: shared libpython, no PGO) takes ~11 ms. PYTHON=... overrides.
PY=${PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=python3
# PYCNI_WHEELHOUSE=DIR: install the Python packages from DIR only (a machine without PyPI, like
# the VM of `make vm-test`; `pip download` them elsewhere into DIR).
# PYCNI_NO_COMPILE=1: no bytecode compiled at install (the VM's TCG took a minute for every
# module of every package; what runs is compiled at its first import).
pip_from=()
[ -z "${PYCNI_WHEELHOUSE:-}" ] || pip_from=(--no-index --find-links "$PYCNI_WHEELHOUSE")
[ "${PYCNI_NO_COMPILE:-}" != 1 ] || pip_from+=(--no-compile)
stamp=.venv/.installed
if [ ! -x .venv/bin/python ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: venv in .venv"
  pip_wheel=
  [ -z "${PYCNI_WHEELHOUSE:-}" ] ||
    pip_wheel=$(find "$PYCNI_WHEELHOUSE" -maxdepth 1 -name 'pip-*.whl' | sort -V | tail -n1)
  if [ ! -x .venv/bin/python ] && [ -n "$pip_wheel" ]; then
    # pip itself from the wheelhouse, run from its wheel: one pip install, not ensurepip's and
    # then the upgrade to it (most of a minute under the VM's TCG)
    "$PY" -m venv --without-pip .venv
    .venv/bin/python "$pip_wheel/pip" install -q "${pip_from[@]}" pip
  else
    [ -x .venv/bin/python ] || "$PY" -m venv .venv
    .venv/bin/python -m pip install -q "${pip_from[@]}" --upgrade pip >/dev/null 2>&1 || true
  fi
  .venv/bin/python -m pip install -q "${pip_from[@]}" -e '.[dev]' >/dev/null 2>.venv/pip.log \
    || { cat .venv/pip.log; exit 1; }
  touch "$stamp"
fi
