"""``python -m benchmarks``: run the benchmark suite (``--help`` for the options)."""

from __future__ import annotations

import sys

from ._cli import main

if __name__ == "__main__":
    sys.exit(main())
