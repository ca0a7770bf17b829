"""The result line a job prints with ``--json``: one writer and one parser for both sides.

A job (``kafka_group_jobs``) ends its stdout with ``KGO-RESULT {json}``: the snapshot's
manifest, the restore's audit, the checkpoint's manifest. Whoever runs the job as a
subprocess (the operator, the demo, the benchmarks) finds the last such line and parses it.
The JSON is written with sorted keys on one line, so the line is the same for the same result.

Pure: text in, text out.
"""

from __future__ import annotations

import json
from typing import Any

PREFIX = "KGO-RESULT "


class ResultError(ValueError):
    """A result line whose JSON is not an object."""


def result_line(result: dict[str, Any]) -> str:
    """``KGO-RESULT {json}`` (no newline); the JSON holds no line break."""
    return PREFIX + json.dumps(result, sort_keys=True)


def parse_result(output: str) -> dict[str, Any] | None:
    """The document of the last result line of a job's stdout; None when it printed none.

    Raises ``ResultError`` when that line does not hold a JSON object.
    """
    for line in reversed(output.splitlines()):
        if line.startswith(PREFIX):
            try:
                parsed = json.loads(line.removeprefix(PREFIX))
            except ValueError as error:
                raise ResultError(f"the job's result line is not JSON: {error}") from None
            if not isinstance(parsed, dict):
                raise ResultError("the job's result line is not a JSON object")
            return parsed
    return None
