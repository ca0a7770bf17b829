"""The member library loads nothing beyond the base install (confluent-kafka, stdlib)."""

from __future__ import annotations

import json
import subprocess
import sys

OPERATOR_ONLY = ("aiohttp", "kopf", "kubernetes_asyncio", "kubernetes", "pyspark", "yaml")


def test_importing_the_member_library_loads_no_operator_dependency() -> None:
    # A fresh interpreter: this test process has imported everything already.
    code = (
        "import json, sys\n"
        "import kafka_group_operator.member\n"
        "top = {name.split('.')[0] for name in sys.modules}\n"
        f"print(json.dumps(sorted(top & set({OPERATOR_ONLY!r}))))"
    )
    loaded = json.loads(
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True).stdout
    )
    assert loaded == []
