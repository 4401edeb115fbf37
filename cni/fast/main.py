"""The entry of the executables an earlier `pycni install` wrote (they fill
cni.registry.INSTALLED themselves, then call this main): the stdlib-only shim, see shim.py.
Today's bin/cni-plugin imports cni.fast.shim itself, one module less an exec (~0.1 ms of CPU);
this one stays so that executables not yet rewritten keep working after an upgrade."""

from cni.fast.shim import leave, main

__all__ = ["leave", "main"]
