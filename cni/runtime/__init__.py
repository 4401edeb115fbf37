"""The invoking side of CNI (what libcni is in Go): conflists, plugin exec, chains, result cache.

It execs plugins (never imports cni.plugins) and imports nothing heavy: no pydantic, no pyroute2.
The package imports none of its modules: bridge's IPAM delegation needs cni.runtime.invoke
alone, and chain, cache and conflist would cost each bridge exec ~5 ms. Import the module.
"""
