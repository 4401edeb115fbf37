"""`make vm-test`: a Debian node in qemu, pycni installed with systemd, driven by real clients.

Builds (once, cached under build/vm) a bookworm image with mmdebstrap from the host's own apt
sources, boots it with its own kernel from a throwaway qcow2 overlay, copies the project in, and
runs the node scenario in the guest over ssh (integration/vm/guest.sh, one step per call). Each
step prints `PASS|FAIL <step> (<seconds>s) <detail>`; the run ends with `N passed, N failed`.
Host commands log to build/vm/host.log, the guest's to build/vm/run/guest.log.

The guest reaches no PyPI (qemu's user network carries no HTTPS to it here): the project's
dependencies' wheels are downloaded on the host into build/vm/wheelhouse, pycni's own wheel is
built there from the tree at each run, and the guest installs them with --no-index. CRI-O has
no Debian 12 package: the guest gets shared/reference/bin's crio and pinns (beside the checkout).
/dev/kvm on these machines runs only specially built guest kernels, so TCG is used unless the
CPU advertises vmx/svm.

    python3 integration/vm/vm.py [--keep] [--steps a,b,...]      (make vm-test)
    python3 integration/vm/vm.py --image-only                    (.ci/run, beside make test)
    python3 integration/vm/vm.py --clean                         (make vm-clean)
    python3 integration/vm/vm.py --box                           (make vagrant-box)

`--box` makes the same image a local Vagrant box for the libvirt provider, build/vagrant/
pycni-bookworm64.box, and adds it as pycni/bookworm64 (the Vagrantfile uses it when PYCNI_BOX
names it): the image plus Vagrant's insecure key for its `vagrant` user, booted by libvirt with
the image's own kernel and initrd (the disk has no bootloader).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "build" / "vm"
HOST_LOG = WORK / "host.log"
GUEST_DIR = "/opt/pycni"
SUITE = "bookworm"
DISK_SIZE = "6G"

# Everything the guest runs, so that it needs no network for packages: the node's runtime and
# clients, what scripts/setup.sh installs, a kernel that has bridge VLAN filtering, and Go with
# Debian's libcni for our cnitool. Not podman, as on a Kubernetes node: Debian's podman ships
# tmpfiles.d's `D! /var/lib/cni/networks`, which empties every network's host-local store at
# boot, and the reboot step is about what a node keeps. The guest's setup.sh gets this list
# (PYCNI_TEST_PACKAGES), so it installs nothing more.
PACKAGES = sorted([
    "linux-image-amd64", "initramfs-tools", "systemd-sysv", "udev", "dbus", "openssh-server",
    "ca-certificates", "iproute2", "nftables", "libnftables1", "conntrack", "kmod", "e2fsprogs",
    "containernetworking-plugins", "iperf3", "busybox-static", "procps", "psmisc",
    "iputils-ping", "ncat", "containerd", "runc", "buildah", "iptables", "curl",
    "util-linux", "python3", "python3-venv", "golang-go", "golang-github-appc-cni-dev",
    "conmon", "libseccomp2", "libsqlite3-0",  # CRI-O (shared/reference/bin's crio, copied in)
    "rsync", "sudo",  # Vagrant's box (--box): its rsync synced folder, its `vagrant` user
])
HOST_PACKAGES = ("mmdebstrap", "qemu-system-x86", "qemu-utils", "e2fsprogs", "openssh-client")

# Files written into the image tree (path -> content).
GUEST_FILES = {
    "etc/hostname": "pycni-node\n",
    "etc/hosts": "127.0.0.1 localhost\n127.0.1.1 pycni-node\n",
    "etc/fstab": "/dev/vda / ext4 defaults 0 1\n",
    "etc/systemd/network/20-wired.network": "[Match]\nName=eth* en*\n\n[Network]\nDHCP=yes\n",
    "etc/ssh/sshd_config.d/pycni.conf": "PermitRootLogin prohibit-password\nUseDNS no\n",
    "etc/modules-load.d/pycni.conf": "br_netfilter\nifb\n8021q\n",
    # Vagrant's user (the box's): no password, no key in the image itself; --box adds the key
    "etc/sudoers.d/vagrant": "vagrant ALL=(ALL) NOPASSWD: ALL\n",
}
HOOKS = ('chroot "$1" systemctl enable systemd-networkd ssh',
         'chroot "$1" useradd --create-home --shell /bin/bash --user-group vagrant')
# Our cnitool (integration/cnitool), built at image time in the image's tree by its own Go and
# libcni as the guest would build it (the same command and source path as build.sh there), so
# that the guest's setup step, under TCG, installs it instead of compiling libcni (18 s idle).
# Its source is kept beside it: guest.sh builds it anew if the checkout's differs.
CNITOOL_SRC = ROOT / "integration" / "cnitool" / "cnitool.go"
CNITOOL_DIR = "/usr/local/lib/pycni-cnitool"
CNITOOL_HOOKS = (
    f'mkdir -p "$1/opt/pycni/integration/cnitool" "$1{CNITOOL_DIR}"',
    f"copy-in {CNITOOL_SRC} /opt/pycni/integration/cnitool",  # (its host path: not in the key)
    f'chroot "$1" sh -ec "cd /opt/pycni/integration/cnitool && GO111MODULE=off'
    f' GOPATH=/usr/share/gocode GOCACHE=/tmp/pycni-gocache go build -o {CNITOOL_DIR}/cnitool'
    f' /opt/pycni/integration/cnitool/cnitool.go && cp cnitool.go {CNITOOL_DIR}/'
    f' && rm -rf /opt/pycni /tmp/pycni-gocache"')
# cryptomgr.notests: no crypto self-tests at boot (under TCG on a busy host one ran for minutes,
# the soft-lockup watchdog firing, before ssh could answer)
KERNEL_ARGS = "root=/dev/vda rw console=ttyS0 net.ifnames=0 quiet cryptomgr.notests"
# CRI-O 1.33.5, built for Debian 12 (its README): copied into the guest's /opt/crio-bin.
CRIO_BIN = ROOT.parent / "shared" / "reference" / "bin"
CRIO_FILES = ("crio", "pinns")
BOX_NAME = "pycni/bookworm64"
BOX_DIR = ROOT / "build" / "vagrant"


def say(line: str) -> None:
    print(line, flush=True)


def run(*cmd: str | Path, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], check=check, **kw)


def logged(*cmd: str | Path, env: dict[str, str] | None = None) -> None:
    """A host command whose output goes to build/vm/host.log (the run prints one line per step);
    a failure raises with the log's tail."""
    HOST_LOG.parent.mkdir(parents=True, exist_ok=True)
    with open(HOST_LOG, "ab") as f:
        f.write(f"\n$ {' '.join(map(str, cmd))}\n".encode())
        f.flush()
        rc = subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env).returncode
    if rc != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} exit {rc}: {tail(HOST_LOG)}")


# --- host side: packages, image, wheelhouse ------------------------------------------------

def host_packages(extra: tuple[str, ...] = ()) -> None:
    missing = [p for p in (*HOST_PACKAGES, *extra)
               if run("dpkg-query", "-W", "-f=${Status}", p, check=False,
                      capture_output=True, text=True).stdout != "install ok installed"]
    if missing:
        env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
        logged("apt-get", "update", "-qq", env=env)
        logged("apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing, env=env)


def image_key() -> str:
    text = "\n".join([SUITE, DISK_SIZE, *PACKAGES, *HOOKS,
                      CNITOOL_HOOKS[0], CNITOOL_HOOKS[2], CNITOOL_SRC.read_text(),
                      *sorted(f"{k}={v}" for k, v in GUEST_FILES.items())])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def debian_mirror() -> str:
    """The host's own Debian mirror for SUITE main, from its apt sources (deb822 or one-line):
    the image comes from wherever this host gets its packages."""
    def entries() -> Iterator[tuple[list[str], list[str], list[str], list[str]]]:
        d = Path("/etc/apt/sources.list.d")
        for f in sorted(d.glob("*.sources")) if d.is_dir() else []:
            for stanza in f.read_text().split("\n\n"):
                fields: dict[str, list[str]] = {}
                for line in stanza.splitlines():
                    if line.strip() and not line.lstrip().startswith("#") and ":" in line:
                        key, _, value = line.partition(":")
                        fields[key.strip().lower()] = value.split()
                if fields.get("enabled", ["yes"])[0].lower() != "no":
                    yield (fields.get("types", []), fields.get("uris", []),
                           fields.get("suites", []), fields.get("components", []))
        for f in [Path("/etc/apt/sources.list"), *sorted(d.glob("*.list"))]:
            for line in f.read_text().splitlines() if f.is_file() else []:
                words = re.sub(r"\[[^]]*\]", " ", line.split("#")[0]).split()  # no [options]
                if len(words) >= 4:
                    yield [words[0]], [words[1]], [words[2]], words[3:]

    for types, uris, suites, components in entries():
        if "deb" in types and SUITE in suites and "main" in components and uris:
            return uris[0]
    raise RuntimeError(f"no 'deb ... {SUITE} main' source in the host's apt sources")


def build_image() -> Path:
    """build/vm/<key>/: disk.raw, vmlinuz, initrd.img, the ssh key. Reused when present."""
    base = WORK / image_key()
    if (base / "disk.raw").exists():
        return base
    tmp = WORK / f"{base.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tree = tmp / "root"
    tmp.mkdir(parents=True)
    run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", tmp / "id_ed25519")
    logged("mmdebstrap", "--variant=apt", "--include=" + ",".join(PACKAGES),
        *(f"--customize-hook={hook}" for hook in (*HOOKS, *CNITOOL_HOOKS)), SUITE, tree,
        debian_mirror())
    # mmdebstrap only warns when it cannot unmount the tree's /proc (busy: anything on the host
    # walking the tree at that moment); mkfs -d would then copy a live /proc and fail.
    for mnt in ("dev/pts", "dev", "sys", "proc"):
        if os.path.ismount(tree / mnt):
            run("umount", "--lazy", tree / mnt)
    for rel, content in GUEST_FILES.items():
        path = tree / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        if rel.startswith("etc/sudoers.d/"):
            path.chmod(0o440)  # sudo's own mode for its drop-ins
    ssh_dir = tree / "root" / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text((tmp / "id_ed25519.pub").read_text())
    (ssh_dir / "authorized_keys").chmod(0o600)
    boot = tree / "boot"
    shutil.copy(next(boot.glob("vmlinuz-*")), tmp / "vmlinuz")
    shutil.copy(next(boot.glob("initrd.img-*")), tmp / "initrd.img")
    run("truncate", "-s", DISK_SIZE, tmp / "disk.raw")
    run("mkfs.ext4", "-q", "-F", "-L", "pycni", "-d", tree, tmp / "disk.raw")
    shutil.rmtree(tree)
    for old in WORK.glob("*"):  # keep one image: an old key's is dead weight
        if old.is_dir() and old.name not in (tmp.name, "wheelhouse", "run"):
            shutil.rmtree(old, ignore_errors=True)
    tmp.rename(base)
    return base


@contextlib.contextmanager
def house_lock() -> Iterator[None]:
    """One process at a time on the wheelhouse and pycni's wheel in it: .ci/run's --image-only
    runs beside make test, whose DaemonSet test builds make image from the same wheelhouse."""
    WORK.mkdir(parents=True, exist_ok=True)
    with open(WORK / ".wheelhouse.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def wheelhouse() -> Path:
    """The project's dependencies, dev tools and build requirements as files for --no-index."""
    out = WORK / "wheelhouse"
    stamp = out / ".key"
    key = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == key:
        return out
    out.mkdir(parents=True, exist_ok=True)
    py = ROOT / ".venv" / "bin" / "python"
    logged(py if py.exists() else sys.executable, "-m", "pip", "download", "-q", "-d", out,
        "--only-binary=:all:", "--python-version", "3.11", "--platform", "manylinux2014_x86_64",
        "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
        "pip", "setuptools>=77", "wheel", *project_requirements())
    stamp.write_text(key)
    return out


def project_files() -> list[str]:
    """The tree as it is (committed or not, no ignored files): what the guest and the wheel get."""
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"],
                         capture_output=True, check=True).stdout
    return [f for f in out.decode().split("\0") if f and (ROOT / f).exists()]


def project_wheel(house: Path) -> str:
    """pycni's wheel, built from project_files() in a scratch copy (so the tree gets no build
    litter) with build requirements from the wheelhouse, into the wheelhouse; -> its name."""
    for old in house.glob("pycni-*.whl"):
        old.unlink()
    src = WORK / "wheel-src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    tar = subprocess.run(["tar", "-C", str(ROOT), "-cf", "-", "--", *project_files()],
                         capture_output=True, check=True).stdout
    subprocess.run(["tar", "-C", str(src), "-xf", "-"], input=tar, check=True)
    py = ROOT / ".venv" / "bin" / "python"
    logged(py if py.exists() else sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
           "--no-index", "--find-links", house, "-w", house, src)
    shutil.rmtree(src)
    wheels = [w.name for w in house.glob("pycni-*.whl")]
    if len(wheels) != 1:
        raise RuntimeError(f"pip wheel made {wheels or 'no wheel'} in {house}")
    return wheels[0]


def project_requirements() -> list[str]:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["dev"]]


# --- the Vagrant box (--box) ---------------------------------------------------------------

# The box's own Vagrantfile: vagrant-libvirt boots the image's kernel and initrd, shipped in the
# box beside this file (the disk has no bootloader).
BOX_VAGRANTFILE = """\
# The box of `make vagrant-box` (integration/vm/vm.py --box): `make vm-test`'s image.
Vagrant.configure("2") do |config|
  config.vm.provider "libvirt" do |lv|
    # stock kernels hang under a paravirtual /dev/kvm: KVM only when the CPU shows vmx/svm
    lv.driver = File.read("/proc/cpuinfo") =~ /\\b(vmx|svm)\\b/ ? "kvm" : "qemu"
    lv.kernel = File.join(File.dirname(__FILE__), "vmlinuz")
    lv.initrd = File.join(File.dirname(__FILE__), "initrd.img")
    lv.cmd_line = "{cmdline}"
  end
end
"""


def vagrant_public_keys() -> str:
    """Vagrant's insecure public key(s), from the installed vagrant (Debian's or HashiCorp's
    package): `vagrant up` logs in with them first, then puts a key of its own in their place."""
    for pattern in ("/usr/share/vagrant/keys/vagrant.pub",
                    "/usr/share/rubygems-integration/all/gems/vagrant-*/keys/vagrant.pub",
                    "/opt/vagrant/embedded/gems/*/gems/vagrant-*/keys/vagrant.pub",
                    "/opt/vagrant/embedded/gems/gems/vagrant-*/keys/vagrant.pub"):
        for found in sorted(Path("/").glob(pattern.lstrip("/"))):
            return found.read_text()
    raise RuntimeError("no keys/vagrant.pub of an installed vagrant")


def authorize_vagrant(disk: Path) -> None:
    """Vagrant's insecure key into /home/vagrant/.ssh of the ext4 disk, with debugfs (no mount,
    no boot): the box's only difference from the image."""
    passwd = run("debugfs", "-R", "cat /etc/passwd", disk, capture_output=True, text=True)
    ids = next(line.split(":")[2:4] for line in passwd.stdout.splitlines()
               if line.startswith("vagrant:"))
    keys = disk.parent / "authorized_keys"
    keys.write_text(vagrant_public_keys())
    ssh, auth = "/home/vagrant/.ssh", "/home/vagrant/.ssh/authorized_keys"
    script = disk.parent / "debugfs.cmd"
    script.write_text("\n".join([
        f"mkdir {ssh}", f"cd {ssh}", f"write {keys} authorized_keys",
        f"sif {ssh} mode 040700", f"sif {auth} mode 0100600",
        *(f"sif {path} {field} {value}" for path in (ssh, auth)
          for field, value in zip(("uid", "gid"), ids, strict=True)), ""]))
    logged("debugfs", "-w", "-f", script, disk)
    check = run("debugfs", "-R", f"cat {auth}", disk, capture_output=True, text=True)
    if check.stdout != keys.read_text():  # debugfs reports its errors but exits 0
        raise RuntimeError(f"debugfs did not write {auth}: {tail(HOST_LOG)}")


def build_box(image: Path) -> Path:
    """build/vagrant/pycni-bookworm64.box: a tar of box.img (qcow2), metadata.json, the box's
    Vagrantfile and the image's kernel and initrd. Rebuilt when the image changed."""
    box = BOX_DIR / "pycni-bookworm64.box"
    stamp = BOX_DIR / "box.key"
    if box.exists() and stamp.exists() and stamp.read_text() == image.name:
        return box
    tmp = BOX_DIR / "box.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    raw = tmp / "disk.raw"
    run("cp", "--sparse=always", image / "disk.raw", raw)
    authorize_vagrant(raw)
    logged("qemu-img", "convert", "-O", "qcow2", raw, tmp / "box.img")
    raw.unlink()
    for name in ("vmlinuz", "initrd.img"):
        shutil.copy(image / name, tmp / name)
    gigabytes = int(DISK_SIZE.rstrip("G"))
    (tmp / "metadata.json").write_text(
        f'{{"provider": "libvirt", "format": "qcow2", "virtual_size": {gigabytes}}}\n')
    (tmp / "Vagrantfile").write_text(BOX_VAGRANTFILE.replace("{cmdline}", KERNEL_ARGS))
    run("tar", "-C", tmp, "-cf", f"{box}.tmp", "metadata.json", "Vagrantfile", "box.img",
        "vmlinuz", "initrd.img")
    Path(f"{box}.tmp").rename(box)
    shutil.rmtree(tmp)
    stamp.write_text(image.name)
    return box


def add_box(box: Path) -> str:
    """`vagrant box add` of the box, unless this box file is already the one added."""
    added = BOX_DIR / "box.added"
    listed = run("vagrant", "box", "list", capture_output=True, text=True).stdout.split()
    mark = f"{box.stat().st_mtime_ns} {os.environ.get('VAGRANT_HOME', '~/.vagrant.d')}"
    if BOX_NAME in listed and added.exists() and added.read_text() == mark:
        return "already added"
    logged("vagrant", "box", "add", "--force", "--name", BOX_NAME, box)
    added.write_text(mark)
    return "added"


def make_box() -> int:
    start = time.monotonic()
    host_packages(("vagrant",))
    cached = (WORK / image_key() / "disk.raw").exists()
    image = build_image()
    say(f"image: {'cached' if cached else 'built'} {image.relative_to(ROOT)}")
    say(f"wheelhouse: {wheelhouse().relative_to(ROOT)} (the Vagrantfile syncs it to "
        "/opt/wheelhouse)")
    box = build_box(image)
    say(f"box: {box.relative_to(ROOT)} ({box.stat().st_size >> 20} MiB)")
    say(f"vagrant box {BOX_NAME}: {add_box(box)} ({time.monotonic() - start:.0f}s)")
    say(f"then: PYCNI_BOX={BOX_NAME} vagrant up --provider libvirt   (or make vagrant-test)")
    return 0


# --- the VM -----------------------------------------------------------------------------------

def accel() -> list[str]:
    flags = Path("/proc/cpuinfo").read_text().split()
    if os.path.exists("/dev/kvm") and ("vmx" in flags or "svm" in flags):
        return ["-accel", "kvm", "-cpu", "host"]
    return ["-accel", "tcg,thread=multi", "-cpu", "max"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VM:
    def __init__(self, image: Path, run_dir: Path) -> None:
        self.image, self.dir = image, run_dir
        self.port = free_port()
        self.key = image / "id_ed25519"
        self.serial = run_dir / "serial.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        overlay = self.dir / "overlay.qcow2"
        run("qemu-img", "create", "-q", "-f", "qcow2", "-b", self.image / "disk.raw",
            "-F", "raw", overlay)
        self.proc = subprocess.Popen([
            "qemu-system-x86_64", *accel(), "-smp", "2", "-m", "2048", "-nographic",
            "-monitor", "none", "-serial", f"file:{self.serial}",
            "-kernel", str(self.image / "vmlinuz"), "-initrd", str(self.image / "initrd.img"),
            "-append", KERNEL_ARGS,
            "-drive", f"file={overlay},if=virtio,format=qcow2",
            "-netdev", f"user,id=n0,hostfwd=tcp:127.0.0.1:{self.port}-:22",
            "-device", "virtio-net-pci,netdev=n0"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def ssh_args(self) -> list[str]:
        return ["ssh", "-q", "-i", str(self.key), "-p", str(self.port),
                "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "ConnectTimeout=30", "-o", "ServerAliveInterval=15",
                "-o", "BatchMode=yes", "root@127.0.0.1"]

    def ssh(self, command: str, *, timeout: float = 1800, log: Path | None = None,
            stdin: bytes | None = None) -> int:
        with open(log or os.devnull, "ab") as out:
            try:
                return subprocess.run([*self.ssh_args(), command], input=stdin, stdout=out,
                                      stderr=subprocess.STDOUT, timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                return 124

    def wait_ssh(self, limit: float = 600) -> bool:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.proc and self.proc.poll() is not None:
                return False
            # 15 s: before the guest listens, qemu's forward accepts and ssh waits for a banner
            if self.ssh("true", timeout=15) == 0:
                return True
            time.sleep(2)
        return False

    def boot_id(self) -> str:
        try:
            r = subprocess.run([*self.ssh_args(), "cat /proc/sys/kernel/random/boot_id"],
                               capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            return ""  # going down or not up yet
        return r.stdout.strip()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.ssh("systemctl poweroff", timeout=30)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# --- the scenario -----------------------------------------------------------------------------

Outcome = tuple[bool, str]  # passed, and a detail for the step's line

class Runner:
    def __init__(self) -> None:
        self.passed: list[str] = []
        self.failed: list[str] = []

    def step(self, name: str, action: Callable[[], Outcome]) -> bool:
        """Runs one step and prints `PASS|FAIL name (Ns) detail`."""
        start = time.monotonic()
        try:
            ok, detail = action()
        except Exception as e:  # a step's crash is that step's failure, the run goes on
            ok, detail = False, f"{type(e).__name__}: {e}"
        took = f"({time.monotonic() - start:.0f}s)"
        say(" ".join(w for w in ("PASS" if ok else "FAIL", name, took, detail) if w))
        (self.passed if ok else self.failed).append(name)
        return ok


def guest_step(vm: VM, log: Path, name: str, timeout: float = 1800) -> Callable[[], Outcome]:
    """guest.sh NAME over ssh; its last `ok: ...` line is the step's detail."""
    def action() -> Outcome:
        with open(log, "ab") as f:
            f.write(f"\n===== {name}\n".encode())
            start = f.tell()
        env = f"PYCNI_TEST_PACKAGES='{' '.join(PACKAGES)}'"
        rc = vm.ssh(f"{env} {GUEST_DIR}/integration/vm/guest.sh {name}", timeout=timeout,
                    log=log)
        with open(log, "rb") as f:
            f.seek(start)
            out = f.read().decode(errors="replace").splitlines()
        if rc != 0:
            return False, f"exit {rc}: " + " | ".join(ln.strip() for ln in out[-6:])
        oks = [ln for ln in out if ln.startswith("ok: ")]
        return True, oks[-1][4:] if oks else ""
    return action


def tail(log: Path, lines: int = 6) -> str:
    text = log.read_text(errors="replace").splitlines()
    return " | ".join(line.strip() for line in text[-lines:])


def copy_project(vm: VM) -> Outcome:
    """The checkout (test scripts, tools' sources) to GUEST_DIR, the wheelhouse (with pycni's
    wheel) to /opt/wheelhouse, CRI-O's binaries to /opt/crio-bin."""
    missing = [f for f in CRIO_FILES if not (CRIO_BIN / f).is_file()]
    if missing:
        return False, f"no {', '.join(missing)} in {CRIO_BIN} (shared/ beside the checkout)"
    tar = subprocess.run(["tar", "-C", str(ROOT), "-cf", "-", "--", *project_files()],
                         capture_output=True, check=True).stdout
    rc = vm.ssh(f"rm -rf {GUEST_DIR} && mkdir -p {GUEST_DIR} && tar -C {GUEST_DIR} -xf -",
                stdin=tar, timeout=300)
    if rc != 0:
        return False, f"exit {rc}"
    tar = subprocess.run(["tar", "-C", str(WORK), "-cf", "-", "wheelhouse"], capture_output=True,
                         check=True).stdout
    rc = vm.ssh("rm -rf /opt/wheelhouse && mkdir -p /opt && tar -C /opt -xf -", stdin=tar,
                timeout=300)
    if rc != 0:
        return False, f"exit {rc} (wheelhouse)"
    tar = subprocess.run(["tar", "-C", str(CRIO_BIN), "-cf", "-", *CRIO_FILES],
                         capture_output=True, check=True).stdout
    rc = vm.ssh("mkdir -p /opt/crio-bin && tar -C /opt/crio-bin -xf -", stdin=tar, timeout=300)
    return rc == 0, "" if rc == 0 else f"exit {rc} (CRI-O's binaries)"


def reboot(vm: VM) -> Outcome:
    before = vm.boot_id()
    vm.ssh("systemctl reboot", timeout=30)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        time.sleep(3)
        if vm.wait_ssh(60) and vm.boot_id() not in ("", before):
            return True, "new boot id"
    return False, f"no new boot: {tail(vm.serial)}"


# daemonset: deploy/pycni.yaml's DaemonSet pod through the guest's containerd CRI, on a
# throwaway node of its own (its own containerd, netns and CNI dirs, like cri's), so it neither
# sees nor changes the systemd install the steps around it check. Its image is built on the host
# (make image: make test built it already, so a cache hit) and copied in with the forwarder it
# holds, by the pod-image step before the others.
STEPS = ("setup", "install", "cnitool", "cri", "daemonset", "crio", "vlan", "pods-before-reboot",
         "reboot", "after-reboot", "uninstall")
POD_IMAGE_FILES = ("build/image/pycni.oci.tar", "build/forwarder/pycni-forwarder")


def copy_pod_image(vm: VM) -> Outcome:
    """`make image` on the host, its archive and the forwarder to the guest's checkout."""
    logged("make", "-C", ROOT, "image")
    tar = subprocess.run(["tar", "-C", str(ROOT), "-cf", "-", *POD_IMAGE_FILES],
                         capture_output=True, check=True).stdout
    rc = vm.ssh(f"tar -C {GUEST_DIR} -xf -", stdin=tar, timeout=600)
    return rc == 0, f"{len(tar) >> 20} MiB" if rc == 0 else f"exit {rc}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clean", action="store_true", help="remove build/vm and exit")
    parser.add_argument("--box", action="store_true",
                        help="build the image's Vagrant box (libvirt) and add it, then exit")
    parser.add_argument("--keep", action="store_true", help="leave the VM running at the end")
    parser.add_argument("--image-only", action="store_true",
                        help="build (or find cached) the image and the wheelhouse, then exit: "
                             ".ci/run does it while make test runs")
    parser.add_argument("--steps", default=",".join(STEPS), help="guest steps to run, in order")
    args = parser.parse_args()
    if args.clean:
        shutil.rmtree(WORK, ignore_errors=True)
        say(f"removed {WORK}")
        return 0
    if os.geteuid() != 0:
        say("make vm-test: run as root (mmdebstrap, mkfs -d)")
        return 2
    if args.box:
        try:
            return make_box()
        except (RuntimeError, subprocess.CalledProcessError) as e:
            say(f"make vagrant-box: {e}")
            return 1
    steps = [s for s in args.steps.split(",") if s]
    # SIGTERM (a CI timeout, kill) unwinds like Ctrl-C, so the finally below stops the VM
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    HOST_LOG.unlink(missing_ok=True)
    r = Runner()
    image: dict[str, Path] = {}

    def prepare() -> Outcome:
        host_packages()
        cached = (WORK / image_key() / "disk.raw").exists()
        image["base"] = build_image()
        with house_lock():
            wheel = project_wheel(wheelhouse())
        return True, f"{'cached' if cached else 'built'} {image['base'].relative_to(ROOT)}; {wheel}"

    if not r.step("image", prepare):
        say(f"0 passed, {len(r.failed)} failed")
        return 1
    if args.image_only:
        return 0
    run_dir = WORK / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    log = run_dir / "guest.log"
    vm = VM(image["base"], run_dir)
    vm.start()
    try:
        booted = r.step("boot", lambda: (True, "") if vm.wait_ssh()
                        else (False, f"no ssh: {tail(vm.serial)}"))
        if booted and r.step("copy", lambda: copy_project(vm)) and (
                "daemonset" not in steps or r.step("pod-image", lambda: copy_pod_image(vm))):
            for name in steps:
                if name == "reboot":
                    r.step("reboot", lambda: reboot(vm))
                else:
                    r.step(name, guest_step(vm, log, name))
    finally:
        if not args.keep:
            vm.stop()
    say(f"guest log: {log}; serial: {vm.serial}")
    say(f"total {time.monotonic() - started:.0f}s")
    say(f"{len(r.passed)} passed, {len(r.failed)} failed")  # alone on its line: CI reads it
    return 0 if not r.failed else 1


if __name__ == "__main__":
    sys.exit(main())
