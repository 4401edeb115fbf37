"""The executables' entry (bin/cni-plugin calls main): the stdlib-only shim, see shim.py."""

from cni.fast.shim import leave, main

__all__ = ["leave", "main"]
