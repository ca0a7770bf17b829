"""The daemon a local job's Spark forks its Python workers from (``spark.python.daemon.module``).

Spark puts its distribution's ``python/lib/pyspark.zip`` first on every Python worker's path.
Nothing is compiled once from a zip: every worker compiled pyspark's modules again before its
first record (about 0.6 s of CPU each, on two cores shared with the JVM). When that zip is the
one inside the installed pyspark package itself (pip's layout, the local path's), the installed
package is the same release, already compiled, so the daemon drops the zip from the path before
pyspark is imported; the workers it forks inherit the path. Any other layout is left alone.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import PathFinder


def installed_first(path: list[str]) -> list[str]:
    """``path`` without the zip of the installed pyspark's own distribution, if it is on it."""
    zips = [entry for entry in path if os.path.basename(entry) == "pyspark.zip"]
    if not zips:
        return path
    rest = [entry for entry in path if entry not in zips]
    spec = PathFinder.find_spec("pyspark", rest)
    if spec is None or spec.origin is None:
        return path
    own_zip = os.path.join(os.path.dirname(spec.origin), "python", "lib", "pyspark.zip")
    if not all(os.path.realpath(entry) == os.path.realpath(own_zip) for entry in zips):
        return path
    return rest


if __name__ == "__main__":
    sys.path[:] = installed_first(sys.path)
    from pyspark import daemon

    daemon.manager()
