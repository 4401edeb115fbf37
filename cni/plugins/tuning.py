"""tuning: sysctls and link settings (mac, mtu, promisc, allmulti, txQLen) of the pod's
interface, chained after the plugin that made it, as the reference's meta plugin.

add / check / delete read like the reference's cmdAdd / cmdCheck / cmdDel; the config and its
sources are in cni.plugins.tuning_conf, the record DEL restores from in cni.plugins.tuning_backup
(the reference's file, byte for byte), the kernel work in cni.host.links and cni.host.sysctl.
ADD passes prevResult on, with the interface's new MAC when it set one. sysctls are not
restored by DEL (neither are they by the reference); link settings are.

Differences from the reference, all deliberate:
- every value is validated before anything changes (code 7 naming the key and value; 4 for
  CNI_ARGS), and a failed ADD puts back what it had changed (sysctls, link settings, the
  backup file); the reference writes sysctls one by one and leaves what it did;
- DEL never fails over the config (the reference's fails on a value its parser refuses);
- a DEL whose pod namespace or interface is gone (or whose CNI_NETNS is empty) removes the
  backup file (the reference's keeps it forever), as does one whose file cannot be decoded;
- CHECK compares a sysctl's words (the kernel prints `32768\t60999` for `32768 60999`) and
  MACs however written; the result carries the MAC in the canonical form;
- a negative mtu or txQLen, a MAC that is not a unicast 6-byte address, and a relative
  dataDir are refused (the reference hands them to the kernel, which wraps a negative txQLen
  to 4294967295);
- dataDir and the sysctl allowlist must be root's alone (cni.plugins.tuning_backup,
  tuning_allowlist), else ADD is refused;
- promisc is the interface's own IFF_PROMISC (what a user set), not the kernel's count of
  promiscuity holders (a packet socket or a bridge would make CHECK fail there).
"""

from __future__ import annotations

import copy
import errno

from cni.host import links, netns, sysctl
from cni.host.errors import NamespaceError, NamespaceMissing
from cni.plugins import tuning_allowlist
from cni.plugins import tuning_backup as backups
from cni.plugins.tuning_backup import Backup, UnsafeDir
from cni.plugins.tuning_conf import Settings, data_dir_for_del, load
from cni.plugins.undo import Undo
from cni.skel import Request, passes_through, require_printable
from cni.spec.errors import CNIError, Code, invalid_config
from cni.spec.result import Result

# A value the kernel refuses for this link: the config's fault, named as such.
_REFUSED_VALUE = {errno.EINVAL, errno.ERANGE, errno.EADDRNOTAVAIL, errno.EOPNOTSUPP}


def _require_prev(req: Request) -> Result:
    if req.prev_result is None:
        raise CNIError(Code.INVALID_CONFIG,
                       "tuning must be called as a chained plugin: prevResult is missing")
    return req.prev_result


def with_mac(prev: Result, ifname: str, mac: str | None) -> Result:
    """prevResult with CNI_IFNAME's interfaces carrying `mac`; prev itself if none changes."""
    if not mac or not any(i.get("name") == ifname and i.get("mac") != mac
                          for i in prev.get("interfaces") or []):
        return prev
    result = copy.deepcopy(prev)
    for iface in result["interfaces"]:
        if iface.get("name") == ifname:
            iface["mac"] = mac
    return result


# --- ADD --------------------------------------------------------------------------------------

def add(req: Request) -> Result:
    settings = load(req)
    tuning_allowlist.check(settings)
    prev = _require_prev(req)
    result = with_mac(prev, req.ifname, settings.mac)
    require_printable(result, req.version, passthrough=passes_through(req, result))
    # Entered even with nothing to change: a CNI_NETNS that is no namespace is refused (4).
    with netns.entered(req.netns_target), netns.iproute() as ipr, Undo(req) as undo:
        link = None
        if settings.touches_link():
            link = links.get(ipr, req.ifname)
            if link is None:
                raise CNIError(Code.INTERNAL, f'tuning: no link "{req.ifname}" in the '
                               "container's network namespace")
        _write_sysctls(settings, undo)
        if link is not None:
            saved = _original(settings, link)
            _backup(req, saved, settings.data_dir, undo)
            undo.push(f"settings of {req.ifname}", lambda: [
                req.log(f"undo: {failure}") for failure in _restore(ipr, link.index, saved)])
            _apply(ipr, link.index, settings)
    return result


def _write_sysctls(settings: Settings, undo: Undo) -> None:
    for item in settings.sysctls:
        try:
            before: str | None = sysctl.read_file(item.path).rstrip("\n")
        except OSError:
            before = None  # write-only (route.flush) or missing: nothing to put back
        try:
            sysctl.write_file(item.path, item.value)
        except OSError as e:
            raise invalid_config(f"sysctl {item.key}", item.value,
                                 f"{item.path}: {e.strerror or e}") from None
        if before is not None:
            undo.push(f"sysctl {item.key}",
                      lambda path=item.path, value=before: sysctl.write_file(path, value))


def _original(settings: Settings, link: links.Link) -> Backup:
    """The link's values now, for the settings this ADD changes (the reference's
    createBackup)."""
    return Backup(mac=link.mac if settings.mac else None,
                  promisc=link.promisc if settings.promisc else None,
                  mtu=link.mtu if settings.mtu else None,
                  allmulti=link.allmulti if settings.allmulti is not None else None,
                  txqlen=link.txqlen if settings.txqlen is not None else None)


def _backup(req: Request, saved: Backup, data_dir: str, undo: Undo) -> None:
    earlier = backups.read_raw(data_dir, req.container_id, req.ifname)
    try:
        backups.save(data_dir, req.container_id, req.ifname, saved)
    except UnsafeDir as e:
        raise invalid_config("dataDir", data_dir, str(e)) from None
    except OSError as e:
        raise CNIError(Code.IO_FAILURE, f"tuning: backup of {req.ifname}'s settings in "
                       f"{data_dir}: {e.strerror or e}") from None
    if earlier is None:
        undo.push("backup file",
                  lambda: backups.remove(data_dir, req.container_id, req.ifname))
    else:  # a repeated ADD: its file goes back as it was
        undo.push("backup file", lambda: backups.write_raw(data_dir, req.container_id,
                                                           req.ifname, earlier))


def _apply(ipr, index: int, settings: Settings) -> None:
    """The reference's order: mac, promisc, mtu, allmulti, txQLen."""
    from pyroute2 import NetlinkError

    steps = []
    if settings.mac:
        steps.append(("mac", settings.mac, lambda: links.set_mac(ipr, index, settings.mac)))
    if settings.promisc:
        steps.append(("promisc", True,
                      lambda: links.set_flag(ipr, index, links.IFF_PROMISC, True)))
    if settings.mtu:
        steps.append(("mtu", settings.mtu, lambda: links.set_mtu(ipr, index, settings.mtu)))
    if settings.allmulti is not None:
        steps.append(("allmulti", settings.allmulti, lambda: links.set_flag(
            ipr, index, links.IFF_ALLMULTI, settings.allmulti)))
    if settings.txqlen is not None:
        steps.append(("txqlen", settings.txqlen,
                      lambda: links.set_txqlen(ipr, index, settings.txqlen)))
    for name, value, step in steps:
        try:
            step()
        except NetlinkError as e:
            key = settings.origin[name]
            if e.code in _REFUSED_VALUE:
                raise invalid_config(key, value, f"the kernel refused it: {e.args[-1]}") \
                    from None
            raise CNIError(Code.INTERNAL, f"tuning: setting {key} to {value}: {e.args[-1]}") \
                from None


def _restore(ipr, index: int, saved: Backup) -> list[str]:
    """Put the saved values back, in the reference's order (mtu, mac, promisc, allmulti,
    txQLen); -> what failed (each is tried)."""
    steps = []
    if saved.mtu:
        steps.append(("MTU", lambda: links.set_mtu(ipr, index, saved.mtu)))
    if saved.mac:
        steps.append(("MAC address", lambda: links.set_mac(ipr, index, saved.mac)))
    if saved.promisc is not None:
        steps.append(("promiscuous mode",
                      lambda: links.set_flag(ipr, index, links.IFF_PROMISC, saved.promisc)))
    if saved.allmulti is not None:
        steps.append(("all-multicast mode",
                      lambda: links.set_flag(ipr, index, links.IFF_ALLMULTI, saved.allmulti)))
    if saved.txqlen is not None:
        steps.append(("transmit queue length",
                      lambda: links.set_txqlen(ipr, index, saved.txqlen)))
    failed = []
    for what, step in steps:
        try:
            step()
        except Exception as e:  # each setting on its own: one refusal must not stop the rest
            failed.append(f"failed to restore {what}: {e}")
    return failed


# --- DEL --------------------------------------------------------------------------------------

def delete(req: Request) -> None:
    """Restore the link settings the ADD saved, from the file (its or the reference's ADD's),
    and remove the file. Reads nothing of the config but dataDir: never fails over it."""
    data_dir = data_dir_for_del(req.config)
    text = backups.read_raw(data_dir, req.container_id, req.ifname)
    if text is None:
        return
    saved = Backup.from_json(text)
    if saved is None:
        req.log(f"DEL: {backups.path(data_dir, req.container_id, req.ifname)} cannot be "
                "decoded: removed, nothing restored")
    elif not req.netns and req.netns_fd is None:
        req.log("DEL without CNI_NETNS: the interface cannot be reached, nothing restored")
    else:
        try:
            with netns.entered(req.netns_target), netns.iproute() as ipr:
                link = links.get(ipr, req.ifname)
                failed = _restore(ipr, link.index, saved) if link is not None else []
        except NamespaceMissing:
            failed = []  # the pod's namespace is gone, and its interface with it
        except NamespaceError as e:
            req.log(f"DEL: {e}: settings not restored, backup kept")
            return
        if failed:  # kept for a retried DEL, as the reference keeps it
            req.log(f"DEL: {'; '.join(failed)}")
            return
    backups.remove(data_dir, req.container_id, req.ifname)


# --- CHECK ------------------------------------------------------------------------------------

def check(req: Request) -> None:
    settings = load(req)
    _require_prev(req)
    with netns.entered(req.netns_target), netns.iproute() as ipr:
        for item in settings.sysctls:
            try:
                current = sysctl.read_file(item.path)
            except OSError as e:
                raise CNIError(Code.INTERNAL, f"tuning: reading {item.path}: "
                               f"{e.strerror or e}") from None
            if current.split() != item.value.split():
                raise CNIError(Code.INTERNAL, f"tuning: configured value of {item.path} is "
                               f"{item.value!r}, current value is {current.rstrip()!r}")
        link = links.get(ipr, req.ifname)
        if link is None:
            raise CNIError(Code.INTERNAL, f"Cannot find container link {req.ifname}")
        wanted = [("mac", settings.mac, link.mac), ("promisc", settings.promisc, link.promisc),
                  ("mtu", settings.mtu, link.mtu), ("allmulti", settings.allmulti,
                                                    link.allmulti),
                  ("txqlen", settings.txqlen, link.txqlen)]
        for name, want, got in wanted:
            # unset settings are not compared, but promisc false is (as the reference)
            if (name == "promisc" or want is not None) and want != got:
                raise CNIError(Code.INTERNAL, f"tuning: {settings.origin[name]} of "
                                   f"{req.ifname} is configured {want}, current value is {got}")


def gc(req: Request) -> None:
    """Nothing is collected: a backup file is named by container ID and ifname only (the
    reference's name), so a network's list of valid attachments cannot tell another network's
    file from a stale one of its own. DEL removes each file, also when the pod is gone."""
    req.log("GC: backup files carry no network name: none removed")


def status(req: Request) -> None:
    return None
