"""``python -m bench [NAME ...]``: run the named benchmarks (all by default).

Each benchmark is a module ``bench/<name>.py`` with ``main(argv) -> int`` that writes
``bench/results/<name>.json``; ``bench/README.md`` summarises the figures.
"""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = (
    "assignors",
    "coordinator",
    "state_topic",
    "rebalance",
    "jobs",
    "protocol",
    "frames",
    "gateway",
    "join",
    "failover",
    "failover_kafka",
    "handover",
    "takeover",
    "scale",
)


def main(argv: list[str]) -> int:
    names = [name for name in argv if not name.startswith("-")] or list(BENCHMARKS)
    options = [arg for arg in argv if arg.startswith("-")]
    unknown = [name for name in names if name not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")
        return 2
    status = 0
    for name in names:
        print(f"== bench {name}", flush=True)
        module = importlib.import_module(f"bench.{name}")
        status |= module.main(options)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
