"""Where the products of the C++ build are, for the client: the build directory (which holds the
native module `farpool._native` in python/farpool/) and the `farpool` binary.

The build directory is $FARPOOL_BUILD, else the repository's build/ (what `make build` makes);
the binary is $FARPOOL_BIN, else farpool in the build directory. Standard library only.
"""
import os
from pathlib import Path

from farpool.repo import ROOT


def build_dir() -> Path:
    """$FARPOOL_BUILD, else <repository>/build."""
    return Path(os.environ.get("FARPOOL_BUILD", ROOT / "build"))


def native_dir() -> Path:
    """The directory CMake writes the native module farpool._native into."""
    return build_dir() / "python" / "farpool"


def farpool_binary() -> Path:
    """$FARPOOL_BIN, else the farpool binary of the build directory."""
    return Path(os.environ.get("FARPOOL_BIN", build_dir() / "farpool"))
