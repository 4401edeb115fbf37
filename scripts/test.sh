#!/usr/bin/env bash
# Runs the suite in a private mount namespace: /run/netns, /run/pycni and /var/lib/cni are fresh
# tmpfs there, so namespaces and stores the tests make can never leak onto the machine, even on a
# crash, and no test can reach a pycni daemon the machine itself runs.
# Every netns test also makes its own "host" network namespace (tests/cnitest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${PYCNI_IN_TEST_NS:-}" != 1 ] && [ "$(id -u)" = 0 ] && command -v unshare >/dev/null; then
  export PYCNI_IN_TEST_NS=1
  exec unshare --mount --propagation private -- "$0" "$@"
fi
if [ "${PYCNI_IN_TEST_NS:-}" = 1 ]; then
  mkdir -p /run/netns /run/pycni /var/lib/cni
  mount -t tmpfs pycni-test-netns /run/netns
  mount -t tmpfs -o mode=0700 pycni-test-run /run/pycni
  mount -t tmpfs pycni-test-cni /var/lib/cni
fi
# Tests install into scratch dirs: never the host's systemd units (pycni install's default there).
export PYCNI_SYSTEMD=0
set +e
.venv/bin/python -m pytest -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
  # No test selected: fine for a -k or a file chosen by hand; PYCNI_REQUIRE_TESTS=1 (test-py.sh)
  # makes it a failure, since a run that was meant to test must not pass empty.
  echo "pytest collected no tests"
  [ "${PYCNI_REQUIRE_TESTS:-}" = 1 ] && exit 5
  exit 0
fi
exit "$rc"
