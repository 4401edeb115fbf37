"""The exec path: the stdlib-only entry of the executables, and the resident daemon."""
