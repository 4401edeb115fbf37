"""`make image`: pycni's node-agent image, built offline by the project's own files.

A minimal bookworm rootfs made with mmdebstrap from the host's own apt sources (Debian's python3
and libnftables1, nothing else), cached as a tarball under build/image; then, with buildah (vfs
storage under build/image, chroot isolation, no registry: `buildah from scratch`), pycni's wheel
and its dependencies installed into the venv /opt/pycni from a local wheelhouse (integration/vm's:
downloaded once on the host, `pip install --no-index` inside), the forwarder binary beside it when
`make forwarder` has built one, `pycni` as the entrypoint; committed to an OCI archive:

    build/image/pycni.oci.tar   (ref IMAGE, deploy/pycni.yaml's image)

The archive is rebuilt only when what goes into it changed (the rootfs's package list, the files
of the wheel, the forwarder binary): a CI run builds it once, the tests reuse it.

    python3 integration/image.py [--print]       (make image; --print: only the archive's path)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "vm"))
import vm  # noqa: E402  (integration/vm/vm.py: the mirror, the wheelhouse, pycni's wheel)

from cni import __version__  # noqa: E402

ROOT = vm.ROOT
WORK = ROOT / "build" / "image"
ARCHIVE = WORK / "pycni.oci.tar"
IMAGE = f"localhost/pycni:{__version__}"  # what deploy/pycni.yaml runs
VENV = "/opt/pycni"
FORWARDER = ROOT / "build" / "forwarder" / "pycni-forwarder"  # `make forwarder`'s
# The rootfs: the interpreter, the venv module, the nftables library the binding loads. The
# daemon's children run plugins in the node's mount namespace (child.py enters the caller's),
# so the node's own tools are what a plugin would exec there, not the image's.
PACKAGES = ("python3", "python3-venv", "libnftables1")
# no docs, man pages or locales in the image
DPKG_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*",
                 "/usr/share/info/*")
HOST_PACKAGES = ("mmdebstrap", "buildah")
MERGED_USR_HOOK = "/usr/share/mmdebstrap/hooks/merged-usr"
# What the wheel is built from (vm.project_wheel): a change there is a new image.
WHEEL_INPUTS = ("cni/", "conf/", "bin/", "pyproject.toml", "README.md", "LICENSE")


def say(line: str) -> None:
    print(f"image: {line}", flush=True)


def base_key() -> str:
    text = "\n".join([vm.SUITE, *PACKAGES, *DPKG_EXCLUDES, MERGED_USR_HOOK])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def image_key() -> str:
    """The base's key, the wheel's input files' contents, the forwarder's bytes."""
    h = hashlib.sha256(f"{base_key()}\n{IMAGE}\n".encode())
    h.update((ROOT / "integration" / "image.py").read_bytes())
    for rel in sorted(f for f in vm.project_files() if f.startswith(WHEEL_INPUTS)):
        path = ROOT / rel
        h.update(f"{rel}\n".encode())
        h.update(os.readlink(path).encode() if path.is_symlink() else path.read_bytes())
    if FORWARDER.is_file():
        h.update(FORWARDER.read_bytes())
    return h.hexdigest()[:16]


def base_rootfs() -> Path:
    """build/image/base-<key>.tar: the minimal bookworm rootfs, made once."""
    tar = WORK / f"base-{base_key()}.tar"
    if tar.exists():
        return tar
    WORK.mkdir(parents=True, exist_ok=True)
    tmp = WORK / f"partial-{tar.name}"
    tmp.unlink(missing_ok=True)
    # merged /usr made by mmdebstrap's hook, not by the usrmerge package (it pulls in perl:
    # ~50 MB of a 200 MB image, imported into every node's containerd)
    vm.logged("mmdebstrap", "--variant=essential", "--include=" + ",".join(PACKAGES),
              f"--hook-dir={MERGED_USR_HOOK}",
              *(f"--dpkgopt=path-exclude={p}" for p in DPKG_EXCLUDES),
              "--customize-hook=rm -rf \"$1\"/var/cache/apt \"$1\"/var/lib/apt/lists",
              vm.SUITE, tmp, vm.debian_mirror())
    for old in WORK.glob("base-*.tar"):
        old.unlink()
    tmp.rename(tar)
    return tar


class Buildah:
    """buildah on a vfs store of its own under build/image (nothing of the machine's)."""

    def __init__(self, store: Path) -> None:
        self.args = ["--root", str(store / "storage"), "--runroot", str(store / "runroot"),
                     "--storage-driver", "vfs"]

    def __call__(self, *args: str | Path) -> str:
        proc = subprocess.run(["buildah", *self.args, *map(str, args)], capture_output=True,
                              text=True, timeout=1200, env={**vm_env(), "BUILDAH_ISOLATION":
                                                            "chroot"})
        if proc.returncode != 0:
            raise RuntimeError(f"buildah {' '.join(map(str, args))}: {proc.stderr[-2000:]}")
        return proc.stdout.strip()


def vm_env() -> dict[str, str]:
    return {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root"}


def build() -> tuple[Path, bool]:
    """The archive, built unless the one there has this key; -> (path, built now)."""
    key = image_key()
    stamp = WORK / "pycni.key"
    if _built(key, stamp):
        return ARCHIVE, False
    vm.HOST_LOG = WORK / "build.log"  # vm.logged's log: ours, not the VM's
    vm.host_packages(HOST_PACKAGES)
    # The wheelhouse and the wheel stay as they are until it is built; and one build at a time:
    # make test's DaemonSet tests and make vm-test's pod-image step run at once in .ci/run (the
    # second finds the first's archive, and no two mmdebstraps write one base tarball)
    with vm.house_lock():
        if _built(key, stamp):
            return ARCHIVE, False
        return _build(key, stamp, base_rootfs())


def _built(key: str, stamp: Path) -> bool:
    return ARCHIVE.exists() and stamp.exists() and stamp.read_text() == key


def _build(key: str, stamp: Path, base: Path) -> tuple[Path, bool]:
    house = vm.wheelhouse()
    wheel = vm.project_wheel(house)
    store = WORK / "store"
    shutil.rmtree(store, ignore_errors=True)
    buildah = Buildah(store)
    ctr = buildah("from", "scratch")
    try:
        buildah("add", ctr, base, "/")
        buildah("copy", ctr, house, "/tmp/wheelhouse")
        buildah("run", "--network", "none", ctr, "--", "/usr/bin/python3", "-m", "venv", VENV)
        buildah("run", "--network", "none", ctr, "--", f"{VENV}/bin/pip", "install", "-q",
                "--no-cache-dir", "--no-index", "--find-links", "/tmp/wheelhouse",
                f"/tmp/wheelhouse/{wheel}")
        # pip and setuptools installed the venv; nothing in the image runs them after
        buildah("run", "--network", "none", ctr, "--", f"{VENV}/bin/python", "-m", "pip",
                "uninstall", "-q", "-y", "pip", "setuptools")
        buildah("run", "--network", "none", ctr, "--", "/bin/rm", "-rf", "/tmp/wheelhouse")
        if FORWARDER.is_file():
            buildah("copy", "--chmod", "0755", ctr, FORWARDER, f"{VENV}/bin/pycni-forwarder")
        buildah("config", "--entrypoint", json.dumps([f"{VENV}/bin/pycni"]), "--cmd",
                json.dumps(["daemon"]), "--env", f"PATH={VENV}/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--workingdir", "/", "--label", f"org.opencontainers.image.version={__version__}",
                "--label", "org.opencontainers.image.title=pycni", ctr)
        tmp = WORK / "pycni.oci.tar.tmp"
        tmp.unlink(missing_ok=True)
        buildah("commit", "--format", "oci", "--squash", "--quiet", ctr,
                f"oci-archive:{tmp}:{IMAGE}")
    finally:
        subprocess.run(["buildah", *buildah.args, "rm", "--all"], capture_output=True,
                       timeout=120)
        shutil.rmtree(store, ignore_errors=True)
    tmp.rename(ARCHIVE)
    stamp.write_text(key)
    return ARCHIVE, True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print only the archive's path")
    args = parser.parse_args()
    if os.geteuid() != 0:
        say("run as root (mmdebstrap, buildah)")
        return 2
    start = time.monotonic()
    try:
        archive, built = build()
    except (RuntimeError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        say(f"failed: {e}")
        return 1
    if args.print:
        print(archive)
    else:
        size = archive.stat().st_size >> 20
        say(f"{'built' if built else 'cached'} {archive.relative_to(ROOT)} ({IMAGE}, {size} MiB, "
            f"forwarder {'in' if FORWARDER.is_file() else 'not built'}, "
            f"{time.monotonic() - start:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
