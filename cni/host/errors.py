"""The kernel layer's one error type. cni.host knows nothing of CNI: skel reports a HostError
as CNI error 999 with its message unchanged, a NamespaceError (CNI_NETNS cannot be used) as
error 4 and a Busy (a lock of pycni's still held at the end of its wait) as error 11. Plugins
catch these where a failure means something else to them (DEL: gone is fine)."""


class HostError(Exception):
    """A kernel operation failed; the message says what and why."""

    @property
    def msg(self) -> str:
        return str(self)


class NamespaceError(HostError):
    """The network namespace given cannot be opened or is not a network namespace."""


class NamespaceMissing(NamespaceError):
    """The namespace path does not exist (DEL treats it as success)."""


class Busy(HostError):
    """One of pycni's lock files (lockfile.take) stayed taken for the whole wait."""
