"""``python -m bench NAME [options]``: run one benchmark, or ``all`` (see ``bench.runner``)."""

from __future__ import annotations

import sys

from bench import runner

if __name__ == "__main__":
    sys.exit(runner.main(sys.argv[1:]))
