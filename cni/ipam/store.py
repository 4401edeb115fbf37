"""The host-local store on disk, byte for byte the reference's (host-local/backend/disk).

`<dataDir>/<network>/` holds one file per reserved IP, named by the canonical IP string, with the
content `<containerID>\\r\\n<ifname>` (no newline), `last_reserved_ip.<rangeIdx>` holding the last
IP handed out per range set, and `lock`, flocked LOCK_EX for each whole operation: the reference
flocks the same file, so it and we can share a store concurrently.

Every file is reached relative to the network directory's fd with O_NOFOLLOW, and the network
directory itself is opened with O_NOFOLLOW: a symlink planted in the store is never followed, and
nothing outside `<dataDir>/<network>` is ever read, written or removed.
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import os
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from cni.spec import names
from cni.spec.errors import CNIError, Code

LINE_BREAK = "\r\n"
LAST_IP_PREFIX = "last_reserved_ip."
LOCK = "lock"
FILE_MODE = 0o600
DIR_MODE = 0o755
_OPEN_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_READ_CHUNK = 4096
_MAX_CONTENT = 1 << 20


class StoreError(CNIError):
    """The store cannot be used (not creatable, not writable, tampered with)."""


def is_special(name: str) -> bool:
    """`lock` and `last_reserved_ip.*` are bookkeeping, never reservations."""
    return name == LOCK or name.startswith(LAST_IP_PREFIX)


class Reservation(NamedTuple):
    """One reserved IP and its holder; ifname "" in an id-only file (old versions)."""

    ip: str
    container_id: str
    ifname: str


def reservations(entries: Iterable[tuple[str, str]]) -> list[Reservation]:
    """The reservations among a store's entries (file names that are IPs): what GC judges and
    `pycni attachments` shows."""
    out = []
    for name, content in entries:
        try:
            ipaddress.ip_address(name)
        except ValueError:
            continue
        cid, _, ifname = content.strip().partition(LINE_BREAK)
        out.append(Reservation(name, cid, ifname))
    return out


def key(container_id: str, ifname: str) -> str:
    return container_id.strip() + LINE_BREAK + ifname


class Store:
    """One network's directory; use as a context manager: the lock is held inside `with`."""

    def __init__(self, data_dir: str, network: str) -> None:
        if not names.valid_id(network):
            raise CNIError(Code.INVALID_CONFIG,
                           f'invalid name "{network}": invalid characters found in network name')
        self.path = os.path.join(data_dir, network)
        self.dir_fd = _open_network_dir(data_dir, network)
        try:
            self.lock_fd = self._open_lock()
        except BaseException:
            os.close(self.dir_fd)
            raise

    @classmethod
    def existing(cls, data_dir: str, network: str) -> Store | None:
        """The store opened to read only: nothing created, no lock taken (a snapshot); None
        when it does not exist or is not a plain directory."""
        if not names.valid_id(network):
            return None
        try:
            dir_fd = os.open(os.path.join(data_dir, network),
                             os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        store = cls.__new__(cls)
        store.path, store.dir_fd, store.lock_fd = os.path.join(data_dir, network), dir_fd, -1
        return store

    def __enter__(self) -> Store:
        fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for fd in (self.lock_fd, self.dir_fd):
            if fd < 0:
                continue
            try:
                os.close(fd)  # closing the lock's fd releases the flock
            except OSError:
                pass
        self.lock_fd = self.dir_fd = -1

    def _open_lock(self) -> int:
        try:
            return os.open(LOCK, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                           FILE_MODE, dir_fd=self.dir_fd)
        except OSError as e:
            raise StoreError(Code.IO_FAILURE,
                             f"cannot open lock file {self.path}/{LOCK}: {_why(e)}") from None

    # --- reservations ---------------------------------------------------------------------

    def reserve(self, container_id: str, ifname: str, ip: str, range_id: int) -> bool:
        """Create the IP's file exclusively; False if it is taken. Records last_reserved_ip."""
        content = key(container_id, ifname).encode()
        linked = self._link_filled(ip, content)
        if linked is not None:
            if not linked:
                return False
        else:
            try:
                fd = os.open(ip, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                             os.O_CLOEXEC, FILE_MODE, dir_fd=self.dir_fd)
            except FileExistsError:
                return False
            except OSError as e:
                raise StoreError(Code.IO_FAILURE, f"cannot reserve {self.path}/{ip}: "
                                 f"{_why(e)}") from None
            try:
                try:
                    _write_all(fd, content)
                finally:
                    os.close(fd)
            except OSError as e:
                self._unlink(ip)
                raise StoreError(Code.IO_FAILURE, f"cannot write {self.path}/{ip}: {_why(e)}") \
                    from None
        try:
            self._write_small(f"{LAST_IP_PREFIX}{range_id}", ip)
        except StoreError:
            self._unlink(ip)
            raise
        return True

    def _link_filled(self, name: str, content: bytes) -> bool | None:
        """Create `name` already holding `content`: an unnamed file (O_TMPFILE), written, then
        linked into place (EEXIST: taken, False). A process killed half-way leaves nothing,
        where create-then-write (the reference's way) can leave an empty reservation no DEL
        releases. None: no O_TMPFILE here, or no /proc to link through (create-then-write)."""
        try:
            fd = os.open(".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, FILE_MODE,
                         dir_fd=self.dir_fd)
        except OSError:
            return None
        try:
            _write_all(fd, content)
            os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=self.dir_fd, follow_symlinks=True)
        except FileExistsError:
            return False
        except FileNotFoundError:
            return None  # no /proc in this mount namespace
        except OSError as e:
            raise StoreError(Code.IO_FAILURE, f"cannot reserve {self.path}/{name}: {_why(e)}") \
                from None
        finally:
            os.close(fd)
        return True

    def last_reserved(self, range_id: int) -> str | None:
        content = self.read(f"{LAST_IP_PREFIX}{range_id}")
        return content.strip() if content is not None else None

    def read(self, name: str) -> str | None:
        """A regular file's content, or None (missing, symlink, not a regular file)."""
        try:
            fd = os.open(name, _OPEN_READ, dir_fd=self.dir_fd)
        except OSError:
            return None
        try:
            # Read to the end: a long container ID must still match on DEL, never leak. A
            # short read of a regular file is its end: one read for a reservation (the scans
            # of ADD and GC read every file of the store).
            chunks = [os.read(fd, _READ_CHUNK)]
            size = len(chunks[0])
            while len(chunks[-1]) == _READ_CHUNK and (chunk := os.read(fd, _READ_CHUNK)):
                chunks.append(chunk)
                size += len(chunk)
                if size > _MAX_CONTENT:
                    return None  # not something either implementation writes
        except OSError:  # a directory or something else unreadable: not a reservation
            return None
        finally:
            os.close(fd)
        return b"".join(chunks).decode("utf-8", "replace")

    def entries(self) -> Iterator[tuple[str, str]]:
        """(file name, content) of every reservation-looking file: regular, not bookkeeping."""
        with os.scandir(self.dir_fd) as it:
            names = [e.name for e in it if e.is_file(follow_symlinks=False)
                     and not is_special(e.name)]
        for name in names:
            content = self.read(name)
            if content is not None:
                yield name, content

    def owned_by(self, container_id: str, ifname: str) -> list[str]:
        """The reference's GetByID: IPs whose file names (container, ifname) or, as files
        written by old versions do, the container alone."""
        new, old = key(container_id, ifname), container_id.strip()
        return [name for name, content in self.entries() if content.strip() in (new, old)]

    def find(self, container_id: str, ifname: str) -> list[str]:
        """The reference's FindByID: the attachment's IPs, else the container's (old files)."""
        entries = list(self.entries())
        for match in (key(container_id, ifname), container_id.strip()):
            found = [name for name, content in entries if content.strip() == match]
            if found:
                return found
        return []

    def holds(self, container_id: str, ifname: str, ips: list[str]) -> bool:
        """Whether each of these IPs' files names the attachment: reading them alone, not the
        whole store (which holds one file per pod on the node). False for an empty list."""
        want = key(container_id, ifname)
        return bool(ips) and all(not is_special(ip) and "/" not in ip
                                 and (self.read(ip) or "").strip() == want for ip in ips)

    def release_known(self, container_id: str, ifname: str, ips: list[str]) -> bool:
        """Release the attachment when the caller knows its IPs (the previous result) and each
        file names it; False (nothing done) otherwise, for `release` to look everywhere."""
        if not self.holds(container_id, ifname, ips):
            return False
        for ip in ips:
            self._unlink(ip)
        return True

    def release(self, container_id: str, ifname: str) -> list[str]:
        """The reference's ReleaseByID: remove the attachment's files; only if there are none,
        files holding the container ID alone (written by old versions)."""
        found = self.find(container_id, ifname)
        for name in found:
            self._unlink(name)
        return found

    def release_ip(self, ip: str) -> None:
        self._unlink(ip)

    # --- helpers --------------------------------------------------------------------------

    def _unlink(self, name: str) -> None:
        if is_special(name) or "/" in name:
            return
        try:
            os.unlink(name, dir_fd=self.dir_fd)
        except FileNotFoundError:
            pass

    def _write_small(self, name: str, content: str) -> None:
        """Write a bookkeeping file in place; a symlink planted there is replaced, not followed.

        Content at least as long as the file's is written over it at offset 0, without O_TRUNC:
        truncating a file that holds a block costs ext4 a journalled block free and a new
        allocation (~40 us of CPU, ~0.3 ms in a daemon's spare), and `last_reserved_ip.N` is
        rewritten by every ADD, mostly with an address of the same length or longer. The file
        ends the same either way; only a shorter content truncates first, as before (written
        over, the old tail would outlive a writer killed before the truncate)."""
        data = content.encode()
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        for _ in range(2):
            try:
                fd = os.open(name, flags, FILE_MODE, dir_fd=self.dir_fd)
            except OSError as e:
                if e.errno == errno.ELOOP:
                    os.unlink(name, dir_fd=self.dir_fd)  # removes the link, not its target
                    continue
                raise StoreError(Code.IO_FAILURE,
                                 f"cannot write {self.path}/{name}: {_why(e)}") from None
            try:
                if os.fstat(fd).st_size > len(data):
                    os.ftruncate(fd, 0)
                _write_all(fd, data)
            finally:
                os.close(fd)
            return
        raise StoreError(Code.IO_FAILURE, f"cannot write {self.path}/{name}: keeps being a symlink")


def _open_network_dir(data_dir: str, network: str) -> int:
    """Create `<dataDir>/<network>` (0755, as the reference) and open it, never via a symlink."""
    try:  # the usual case, a store that is there: one open (dataDir followed, as below)
        return os.open(os.path.join(data_dir, network),
                       os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        pass  # not there yet, or refused: made, or refused with the reason, below
    try:
        os.makedirs(data_dir, DIR_MODE, exist_ok=True)
        data_fd = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise StoreError(Code.IO_FAILURE, f"cannot create dataDir {data_dir}: {_why(e)}") \
            from None
    try:
        try:
            os.mkdir(network, DIR_MODE, dir_fd=data_fd)
        except FileExistsError:
            pass
        return os.open(network, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                       dir_fd=data_fd)
    except OSError as e:
        path = os.path.join(data_dir, network)
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            why = "it is a symlink or not a directory, refusing to use it"
        else:
            why = _why(e)
        raise StoreError(Code.IO_FAILURE, f"cannot use store {path}: {why}") from None
    finally:
        os.close(data_fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _why(e: OSError) -> str:
    return e.strerror or str(e)
