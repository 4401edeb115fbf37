"""`python -m cni.cli`: the same as the `pycni` command."""

from cni.cli import main

main()
