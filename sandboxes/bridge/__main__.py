"""Entry point for ``python3 -m bridge`` and ``python3 path/to/bridge/__main__.py``."""

import os
import sys

if __package__ in (None, ""):
    # Run as a file: make the package importable by its directory name, so
    # the modules' relative imports work wherever the directory was copied.
    here = os.path.dirname(os.path.abspath(__file__))
    # sys.path[0] is this directory: replace it, so our module names never
    # shadow anything else.
    sys.path[0] = os.path.dirname(here)
    import importlib

    _app = importlib.import_module(os.path.basename(here) + ".app")
else:
    from . import app as _app

if __name__ == "__main__":
    sys.exit(_app.main())
