"""What the daemon imports and warms once, so that its forked children start with it."""

from __future__ import annotations

import ctypes
import importlib
import logging
import os

log = logging.getLogger("pycni.daemon")

# pyroute2: every netlink request goes through its IPRoute (~90 ms to import, once here). Its
# package imports every message class and socket the verbs use (rtnl, tc, conntrack, nftables).
HEAVY_MODULES = ("cni.spec.config", "nftables", "cni.skel", "pyroute2")  # config: pydantic
# Imported inside functions on the request path: imported here, or every child pays for it
# (bandwidth's tc/ifb/peer alone cost ~3 ms a request: module bodies, dataclass builds);
# subprocess for an IPAM plugin that is not ours (~2.5 ms); re2 for tuning's allowlist (a
# module a request imports makes its spare exit after it: child.back_home).
LAZY_MODULES = ("traceback", "subprocess", "re2")
PACKAGES = ("cni.spec", "cni.host", "cni.ipam", "cni.plugins")  # every module in them, too


def preimport(extra: tuple[str, ...] = ()) -> list[str]:
    """Import what requests need, once; returns what is missing (a plugin not written yet)."""
    from cni.registry import PLUGINS

    missing = []
    names = HEAVY_MODULES + tuple(PLUGINS.values()) + LAZY_MODULES + _modules_of(PACKAGES)
    for name in names + extra:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            missing.append(name)
            if e.name != name:
                log.warning("importing %s: %s", name, e)
        except Exception as e:  # a broken module must not stop the daemon: its requests fail
            missing.append(name)
            log.warning("importing %s failed: %s: %s", name, type(e).__name__, e)
    missing += load_entry_points()
    try:
        ctypes.CDLL("libnftables.so.1")  # dlopen once; each child makes its own context
    except OSError:
        pass
    from cni.host import nsfd

    nsfd.libc()  # loaded once, before the forks
    if "cni.spec.config" not in missing:
        from cni.spec.config import Model

        for failure in Model.compile_all():  # a third-party plugin's config models too
            log.warning("config model %s", failure)
    return missing


def load_entry_points() -> list[str]:
    """Import every entry-point plugin (cni.registry.discover, the venv's site dirs) as skel
    would for a request, so that children start with it, once cni.plugload has passed its files
    and its import in a child with a deadline; one refused or failing is reported by name (the
    log, and the status query's "refused", cni.registry.REFUSED) and its requests fail, the
    others are served. The table is then fixed (registry.fix): nothing is read at request time."""
    from cni import plugload, registry, skel

    failed: list[str] = []
    try:
        found = registry.discover(refresh=True)
        sites = registry.site_dirs()
    except Exception as e:  # unreadable metadata: the built-ins are still served
        log.warning("reading the %s entry points failed: %s: %s", registry.GROUP,
                    type(e).__name__, e)
        registry._found = {}
        registry.fix()
        return []
    ok, refused = plugload.vet(found, sites)
    registry.REFUSED.update(refused)
    for name, why in registry.REFUSED.items():
        log.warning("plugin %s not served: %s", name, why)
    failed += [name for name in refused]
    for name in ok:
        target = found[name]
        try:
            skel.load(name, vetted=True)
        except BaseException as e:  # SystemExit too: a plugin's import must not end the daemon
            if isinstance(e, KeyboardInterrupt):
                raise
            why = f"importing {target} failed: {type(e).__name__}: {e}"
            registry.REFUSED[name] = why
            failed.append(name)
            log.warning("plugin %s not served: %s", name, why)
        else:
            log.info("plugin %s served from %s", name, target)
    registry.fix()
    return failed


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
    """Touch what every request touches: skel and the plugin modules; with `netlink`, pyroute2
    too: every kind of request the verbs send encoded once (an IPBatch: nothing is sent) and
    the replies they parse read once (read-only, own netns). The parent does it all once
    before it forks; a spare skips that (the encoders and parsers are built in the image it
    was forked from) and instead keeps one IPRoute of its own for its namespace, from request
    to request (netns.keep_home_socket: made here, before the spare records its fds), and an
    NFTSocket per family its CHECKs ask (nftrecord.keep_home_sockets)."""
    from cni import skel
    from cni.host import dumps, links, netns, warm
    from cni.registry import plugins

    for plugin in plugins():
        skel.run(plugin, {"CNI_COMMAND": "VERSION"}, b'{"cniVersion":"1.0.0"}')
    # One real request, read-only: loopback CHECK of our own namespace's lo. It walks what every
    # request walks (env and config checks, keys, netns.entered, IPRoute): a request after it
    # runs in about half the time (loopback ADD in a spare: ~1.0 -> ~0.5 ms).
    skel.run("loopback", WARM_UP_ENV, WARM_UP_CONFIG)
    try:
        if not netlink:
            keep_home_sockets()
        with netns.iproute() as ipr:
            if netlink:
                lo = links.get(ipr, "lo")
                if lo is not None:
                    dumps.addresses(ipr, lo.index)
        if netlink:
            warm.encode_requests()
            warm.read_replies()
    except Exception as e:  # warming is an optimisation only
        log.debug("warm-up: %s", e)


def keep_home_sockets() -> None:
    """A spare's sockets for its own namespace, kept from request to request: an IPRoute
    (netns.keep_home_socket), an NFTSocket per family its CHECKs ask
    (nftrecord.keep_home_sockets) and a libnftables context (nft.keep_home_context). Made
    before the spare records its fds."""
    from cni.host import netns, nft, nftrecord

    netns.keep_home_socket()
    nftrecord.keep_home_sockets()
    try:
        nft.keep_home_context()
    except nft.NftUnavailable:
        pass  # no libnftables: every verb that needs it says so


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


def set_environ(env: dict[str, str], current: dict[str, str] | None = None) -> dict[str, str]:
    """os.environ becomes `env`, as a request's child sets it (what exec'd programs inherit).
    Only what differs is changed: os.environ.clear() pops key by key, twice the cost.
    `current`: what os.environ is now, as a dict (a spare: the last request's environment, or
    its home one), so that os.environ is not decoded key by key to be compared. -> what
    os.environ now is: `env` without the names putenv refuses."""
    environ = os.environ
    now = environ if current is None else current
    for key in [key for key in now if key not in env]:
        del environ[key]
    refused = []
    for key, value in env.items():
        if now.get(key) != value:
            try:
                environ[key] = value
            except (ValueError, OSError):  # a name putenv refuses: "a=b" ValueError, "" EINVAL
                refused.append(key)
    return env if not refused else {k: v for k, v in env.items() if k not in refused}
