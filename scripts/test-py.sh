#!/usr/bin/env bash
# Usage: scripts/test-py.sh PYTHON [PYTEST_ARGS...]   (make test-py PYTHON=...)
# The unit tests (not root, not slow) and the wheel test (integration/test_wheel.py) under another
# interpreter: CI runs pyenv's 3.12 and 3.13 this way, beside `make test` under the distro's 3.11.
# They run in a copy of this tree at build/py<X.Y> whose .venv is made with PYTHON, so pytest,
# bin/'s executables (they run ../.venv) and the wheel's venv all use that interpreter. The copy
# is refreshed from the tree as it is (tracked and new files); its .venv and its build/ (the
# wheelhouse) are kept between runs. A missing interpreter, or no test collected, is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:?usage: scripts/test-py.sh PYTHON [PYTEST_ARGS...]}
shift
if ! [ -x "$py" ] || ! ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])'); then
  echo "test-py: no working interpreter at $py" >&2
  exit 1
fi
here=$(pwd)
dest=build/py$ver
mkdir -p "$dest"
find "$dest" -mindepth 1 -maxdepth 1 ! -name .venv ! -name build -exec rm -rf {} +
git ls-files -z -c -o --exclude-standard \
  | tar --null --files-from=- --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$dest"
# Tests find shared/ (the reference plugins, cnitool) beside the project's root: the copy's
# parent is build/, so shared/ is linked there.
[ ! -d ../shared ] || ln -sfn "$(cd .. && pwd)/shared" build/shared
cd "$dest"
echo "test-py: Python $ver ($py) in $here/$dest"
PYTHON=$py ./scripts/setup.sh
[ "$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = "$ver" ] \
  || { echo "test-py: $dest/.venv is not Python $ver: remove it" >&2; exit 1; }
export PYCNI_REQUIRE_TESTS=1 PYCNI_WHEEL_PYTHON=$py
./scripts/test.sh -m "not root and not slow" tests "$@"
./scripts/test.sh integration/test_wheel.py "$@"
