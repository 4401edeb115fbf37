"""A small CRI v1 client (what kubelet speaks to containerd / CRI-O), for tests and scripts.

`from integration.cri.client import CRIClient` (or put integration/ on sys.path and import
`cri.client`); stubs are generated from runtime_v1.proto on first use, never committed.
"""
