"""pycni: CNI plugins and a CNI runtime in Python."""

__version__ = "0.1.0"
