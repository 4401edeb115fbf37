"""What the daemon imports and warms once, so that its forked children start with it."""

from __future__ import annotations

import ctypes
import importlib
import logging
import os

log = logging.getLogger("pycni.daemon")

# cni.host.nlsync_iproute: pyroute2's IPRoute, imported by submodule (lean_pyroute2: not its
# __init__), for the requests that still call it (VLANs, GC).
HEAVY_MODULES = ("cni.host.nlsync_iproute", "pydantic", "nftables", "cni.skel")
# Imported inside functions on the request path: imported here, or every child pays for it
# (bandwidth's tc/ifb/peer alone cost ~3 ms a request: module bodies, dataclass builds).
LAZY_MODULES = ("pyroute2.netlink.exceptions", "pyroute2.netlink.rtnl.tcmsg", "traceback")
PACKAGES = ("cni.spec", "cni.host", "cni.ipam", "cni.plugins")  # every module in them, too


def preimport(extra: tuple[str, ...] = ()) -> list[str]:
    """Import what requests need, once; returns what is missing (a plugin not written yet)."""
    from cni.registry import PLUGINS

    missing = []
    for name in HEAVY_MODULES + tuple(PLUGINS.values()) + LAZY_MODULES + _modules_of(PACKAGES) \
            + extra:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            missing.append(name)
            if e.name != name:
                log.warning("importing %s: %s", name, e)
        except Exception as e:  # a broken module must not stop the daemon: its requests fail
            missing.append(name)
            log.warning("importing %s failed: %s: %s", name, type(e).__name__, e)
    try:
        ctypes.CDLL("libnftables.so.1")  # dlopen once; each child makes its own context
    except OSError:
        pass
    from cni.host import nsfd

    nsfd.libc()  # loaded once, before the forks
    compile_netlink_tables()
    return missing


# The netlink messages requests build and parse (rtnetlink, tc), by module.
_TC = "pyroute2.netlink.rtnl.tcmsg"
NETLINK_MODULES = ("pyroute2.netlink", "pyroute2.netlink.rtnl.ifinfmsg",
                   "pyroute2.netlink.rtnl.ifaddrmsg", "pyroute2.netlink.rtnl.rtmsg", _TC,
                   f"{_TC}.common", f"{_TC}.common_act", f"{_TC}.sched_tbf",
                   f"{_TC}.sched_template", f"{_TC}.cls_u32", f"{_TC}.act_mirred")


def compile_netlink_tables() -> int:
    """Compile pyroute2's NLA tables (per class, on its first instance) here in the parent:
    otherwise every child compiles the ~40 a chain uses for itself, ~0.3 ms each."""
    try:
        from pyroute2.netlink import nlmsg_base
    except ImportError:
        return 0
    seen: set[type] = set()

    def visit(cls: type) -> None:
        if cls in seen:
            return
        seen.add(cls)
        try:
            cls()  # nlmsg_base.__init__ compiles the class's table once
        except Exception:  # a class that needs arguments: its table compiles on first use
            pass
        for name in dir(cls):
            nested = getattr(cls, name, None)
            if isinstance(nested, type) and issubclass(nested, nlmsg_base):
                visit(nested)

    roots: list[type] = []
    for module_name in NETLINK_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        roots += [v for v in vars(module).values()
                  if isinstance(v, type) and issubclass(v, nlmsg_base)]
    for cls in roots:
        visit(cls)
    return len(seen)


def _modules_of(packages: tuple[str, ...]) -> tuple[str, ...]:
    import pkgutil

    names = []
    for package in packages:
        module = importlib.import_module(package)
        names += [f"{package}.{m.name}" for m in pkgutil.iter_modules(module.__path__)]
    return tuple(names)


WARM_UP_ENV = {"CNI_COMMAND": "CHECK", "CNI_CONTAINERID": "pycni-warm-up",
               "CNI_NETNS": "/proc/self/ns/net", "CNI_IFNAME": "lo", "CNI_PATH": "/nonexistent"}
WARM_UP_CONFIG = b'{"cniVersion":"1.1.0","name":"pycni-warm-up","type":"loopback"}'


def warm_up(netlink: bool = True) -> None:
    """Touch what every request touches: skel and the plugin modules; with `netlink`, a
    netlink socket too (read-only, own netns). The parent does it all once before it forks;
    a spare skips the netlink reads: they cost each request ~5 ms of CPU (its spare's) while
    requests now read links with host/rtnl.py, so it only builds and drops one socket."""
    from cni import skel
    from cni.host import netns
    from cni.registry import PLUGINS

    for plugin in PLUGINS:
        skel.run(plugin, {"CNI_COMMAND": "VERSION"}, b'{"cniVersion":"1.0.0"}')
    # One real request, read-only: loopback CHECK of our own namespace's lo. It walks what every
    # request walks (env and config checks, keys, netns.entered, rtnl): a request after it
    # runs in about half the time (loopback ADD in a spare: ~1.0 -> ~0.5 ms).
    skel.run("loopback", WARM_UP_ENV, WARM_UP_CONFIG)
    try:
        with netns.iproute() as ipr:
            if netlink:
                index = ipr.link_lookup(ifname="lo")
                ipr.get_links(*index)
                list(ipr.get_addr(index=index[0]))
    except Exception as e:  # warming is an optimisation only
        log.debug("warm-up: %s", e)


def private_netns() -> int | None:
    """An fd of a new, empty network namespace of the daemon's own (no name, no mount: it goes
    with the last fd), where spares warm up with real requests; None if we may not make one.
    Single-threaded callers only (unshare and setns act on the calling thread)."""
    from cni.host import nsfd

    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if nsfd.libc().unshare(nsfd.CLONE_NEWNET) != 0:
            return None
        try:
            return os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            nsfd.setns(home)
    finally:
        os.close(home)


def warm_requests(netns_fd: int | None) -> None:
    """A spare's first requests, ahead of the real one: loopback ADD and CHECK in the daemon's
    private namespace, between the same environment swaps a request makes. They write to what
    the real one writes (glibc's and Python's heaps, the request paths' objects), so its
    copy-on-write faults happen here, at the spare's idle priority, not on its path. Not DEL:
    it leaves a marker file (cni.deleted) on the host."""
    from cni import skel

    saved = dict(os.environ)
    try:
        env = {**WARM_UP_ENV, "CNI_NETNS": f"/proc/self/fd/{netns_fd}"}
        set_environ({**saved, **env})
        if netns_fd is not None:
            for command in ("ADD", "CHECK"):
                skel.run("loopback", {**env, "CNI_COMMAND": command}, WARM_UP_CONFIG, netns_fd)
    except Exception as e:  # warming is an optimisation only
        log.debug("warm-up: %s", e)
    finally:
        set_environ(saved)


def set_environ(env: dict[str, str]) -> None:
    """os.environ becomes `env`, as a request's child sets it (what exec'd programs inherit)."""
    os.environ.clear()
    for key, value in env.items():
        try:
            os.environ[key] = value
        except ValueError:
            continue  # a name putenv refuses
