"""The package's version: the one place it is written. setup.py reads it from
here, and test_packaging.py checks it against the CMake project version."""

__version__ = "0.1.0"
