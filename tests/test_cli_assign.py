"""``kgo assign``: JSON in, assignment out; bad input gives ``{"error"}`` and exit 2."""

from __future__ import annotations

import io
import json
import pathlib
import subprocess
import sys
from typing import Any

import pytest

from kafka_group_operator import cli

EXAMPLE: dict[str, Any] = {
    "assignor": "cooperative-sticky",
    "partitions_per_topic": {"t1": 3, "t2": 2},
    "partition_racks": {"t1": [["a"], ["b"], ["c"]]},
    "members": {
        "m1": {
            "topics": ["t1", "t2"],
            "owned": [["t1", 0]],
            "generation": 1,
            "rack": "a",
            "instance_id": "grp-0",
        }
    },
}


def run(
    args: list[str],
    document: object,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    stderr: list[str] | None = None,
) -> tuple[int, Any]:
    if isinstance(document, bytes):
        data = document
    else:
        data = (document if isinstance(document, str) else json.dumps(document)).encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    code = cli.main(["assign", *args])
    captured = capsys.readouterr()
    if stderr is None:
        assert captured.err == ""
    else:
        stderr.extend(captured.err.splitlines())
    return code, json.loads(captured.out)


def test_module_entry_point_reads_stdin() -> None:
    """The issue's example through ``python -m kafka_group_operator``, in a real process."""
    completed = subprocess.run(
        [sys.executable, "-m", "kafka_group_operator", "assign"],
        input=json.dumps(EXAMPLE),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout) == {
        "assignment": {"m1": [["t1", 0], ["t1", 1], ["t1", 2], ["t2", 0], ["t2", 1]]}
    }


def test_input_file_and_assignor_override(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    document = {
        "partitions_per_topic": {"t0": 3, "t1": 3},
        "members": {"C0": {"topics": ["t0", "t1"]}, "C1": {"topics": ["t0", "t1"]}},
        "assignor": "roundrobin",
    }
    path = tmp_path / "group.json"
    path.write_text(json.dumps(document))
    code, output = run(["--input", str(path), "--assignor", "range"], "", capsys, monkeypatch)
    assert code == 0
    assert output == {
        "assignment": {
            "C0": [["t0", 0], ["t0", 1], ["t1", 0], ["t1", 1]],
            "C1": [["t0", 2], ["t1", 2]],
        }
    }


def test_members_keep_input_order(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    document = {
        "assignor": "uniform",
        "partitions_per_topic": {"t": 2},
        "members": {"zz": {"topics": ["t"]}, "aa": {"topics": ["t"]}},
    }
    code, output = run([], document, capsys, monkeypatch)
    assert code == 0
    assert list(output["assignment"]) == ["zz", "aa"]
    assert output["assignment"] == {"zz": [["t", 1]], "aa": [["t", 0]]}


def test_rounds_until_nothing_is_revoked(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    document = {
        "partitions_per_topic": {"t": 4},
        "members": {
            "old": {
                "topics": ["t"],
                "owned": [["t", 0], ["t", 1], ["t", 2], ["t", 3]],
                "generation": 4,
            },
            "new": {"topics": ["t"]},
        },
    }
    code, output = run(["--rounds"], document, capsys, monkeypatch)
    assert code == 0
    assert output == {
        "rounds": [
            {"old": [["t", 0], ["t", 1]], "new": []},
            {"old": [["t", 0], ["t", 1]], "new": [["t", 2], ["t", 3]]},
        ]
    }


BAD_INPUTS = [
    pytest.param("{not json", "invalid input", id="not-json"),
    pytest.param([1, 2], "the input must be an object", id="not-an-object"),
    pytest.param({"members": {}}, "partitions_per_topic must be an object", id="no-topics"),
    pytest.param({"partitions_per_topic": {"t": 1}}, "members must be an object", id="no-members"),
    pytest.param(
        {"partitions_per_topic": {"t": -1}, "members": {}}, "must not be negative", id="negative"
    ),
    pytest.param(
        {"partitions_per_topic": {"t": 1}, "members": {"m": {"owned": []}}},
        "members.m.topics is required",
        id="member-without-topics",
    ),
    pytest.param(
        {"partitions_per_topic": {"t": 1}, "members": {"m": {"topics": "t"}}},
        "list of strings",
        id="topics-not-a-list",
    ),
    pytest.param(
        {"partitions_per_topic": {"t": 1}, "members": {"m": {"topics": ["t"], "owned": [["t"]]}}},
        "owned[0] must be a [topic, partition] pair",
        id="owned-not-a-pair",
    ),
    pytest.param(
        {"partitions_per_topic": {"t": 1}, "members": {"m": {"topics": ["t"], "generation": True}}},
        "generation must be an integer",
        id="generation-boolean",
    ),
    pytest.param(
        {"partitions_per_topic": {"t": 1}, "members": {"m": {"topics": ["t"], "rakc": "a"}}},
        "unknown field(s): rakc",
        id="unknown-member-field",
    ),
    pytest.param(
        {"partitions_per_topic": {"t": 2}, "partition_racks": {"t": [["a"]]}, "members": {}},
        "racks of each of its 2 partitions",
        id="racks-length",
    ),
    pytest.param(
        {"assignor": "fair", "partitions_per_topic": {}, "members": {}},
        "unknown assignor 'fair'; valid: cooperative-sticky, range, roundrobin, sticky, uniform",
        id="unknown-assignor",
    ),
    pytest.param(
        {"assignor": "uniform", "partitions_per_topic": {}, "members": {"m": {"topics": ["x"]}}},
        "subscribed topics have no metadata: x",
        id="uniform-without-metadata",
    ),
]


@pytest.mark.parametrize(("document", "message"), BAD_INPUTS)
def test_bad_input_is_an_error_object_and_exit_2(
    document: object,
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, output = run([], document, capsys, monkeypatch)
    assert code == 2
    assert list(output) == ["error"]
    assert message in output["error"]


# Malformed input found by fuzzing: each is refused in one line, with exit code 2.
ONE_TOPIC = {"partitions_per_topic": {"t": 3}}
MALFORMED = [
    pytest.param(b"[" * 100_000, "nested too deeply", id="deep-nesting"),
    pytest.param(
        b'{"partitions_per_topic": {"t": 1' + b"0" * 5_000 + b'}, "members": {}}',
        "a number of 5001 digits",
        id="5000-digit-number",
    ),
    pytest.param(
        {"partitions_per_topic": {"t": 10**18}, "members": {}},
        "partitions_per_topic.t is 1000000000000000000, outside Kafka's int32",
        id="10^18-partitions",
    ),
    pytest.param(
        {"partitions_per_topic": {"t": 600_000, "u": 600_000}, "members": {}},
        "1200000 partitions in all; at most 1000000",
        id="too-many-partitions",
    ),
    pytest.param(
        b'{"partitions_per_topic": {"t\xff": 1}, "members": {}}',
        "not UTF-8: byte 28 (invalid start byte)",
        id="invalid-utf-8",
    ),
    pytest.param(
        '{"partitions_per_topic": {"t": 1}, "members": {"m\\ud800": {"topics": ["t"]}}}',
        "a member id is not valid Unicode (a lone surrogate)",
        id="lone-surrogate",
    ),
    pytest.param(
        '{"partitions_per_topic": {"t": NaN}, "members": {}}',
        "NaN is not a JSON number",
        id="nan",
    ),
    pytest.param(
        {**ONE_TOPIC, "members": {"m": {"topics": ["t"], "generation": 2**31}}},
        "members.m.generation is 2147483648, outside Kafka's int32",
        id="generation-beyond-int32",
    ),
    pytest.param(b" " * (32 * 1024 * 1024 + 1), "more than 33554432 bytes", id="oversized"),
]


@pytest.mark.parametrize(("document", "message"), MALFORMED)
def test_malformed_input_is_refused_in_one_line_with_exit_2(
    document: object,
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, output = run([], document, capsys, monkeypatch)
    assert code == 2
    assert list(output) == ["error"]
    assert message in output["error"]


def test_claims_at_different_generations_are_kafkas_stale_owner_case(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    document = {
        **ONE_TOPIC,
        "assignor": "sticky",
        "members": {
            "a": {"topics": ["t"], "owned": [["t", 0]], "generation": 2},
            "b": {"topics": ["t"], "owned": [["t", 0], ["t", 1]], "generation": 1},
        },
    }
    code, output = run([], document, capsys, monkeypatch)
    assert code == 0
    # The higher generation keeps t-0; b keeps the rest of its claims.
    assert output == {"assignment": {"a": [["t", 0], ["t", 2]], "b": [["t", 1]]}}


@pytest.mark.parametrize(
    "data",
    [
        b"[" * 100_000,
        b'{"partitions_per_topic": {"t": 1' + b"0" * 5_000 + b'}, "members": {}}',
        json.dumps(
            {"partitions_per_topic": {"t": 10**18}, "members": {"m": {"topics": ["t"]}}}
        ).encode(),
        b'{"partitions_per_topic": {"t\xff": 1}, "members": {}}',
    ],
    ids=["deep-nesting", "5000-digit-number", "10^18-partitions", "invalid-utf-8"],
)
def test_malformed_input_in_a_real_process_is_one_line_without_traceback(data: bytes) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "kafka_group_operator", "assign"],
        input=data,
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert completed.returncode == 2
    assert completed.stderr == b""
    [line] = completed.stdout.splitlines()
    assert list(json.loads(line)) == ["error"]


def test_missing_input_file_is_an_error(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, output = run(["--input", str(tmp_path / "absent.json")], "", capsys, monkeypatch)
    assert code == 2
    assert "absent.json" in output["error"]


def test_bad_input_in_a_real_process_has_no_traceback() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "kafka_group_operator", "assign", "--assignor", "nope"],
        input="{}",
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert completed.returncode == 2
    assert completed.stderr == ""
    assert "error" in json.loads(completed.stdout)


# Kafka's assignors take odd claims as they come (AbstractStickyAssignorTest): dropped or
# taken from their claimants, never refused.
ODD_CLAIMS = [
    pytest.param(
        {**ONE_TOPIC, "members": {"m": {"topics": ["t"], "owned": [["t", 3], ["t", -1]]}}},
        {"m": [["t", 0], ["t", 1], ["t", 2]]},
        [
            "kgo assign: members.m.owned[0]: 't' has partitions 0 to 2, not 3: dropped",
            "kgo assign: members.m.owned[1]: 't' has partitions 0 to 2, not -1: dropped",
        ],
        id="owned-beyond-the-count",
    ),
    pytest.param(
        {**ONE_TOPIC, "members": {"m": {"topics": ["t"], "owned": [["u", 0], ["t", 1]]}}},
        {"m": [["t", 0], ["t", 1], ["t", 2]]},
        ["kgo assign: members.m.owned[0]: topic 'u' has no partitions (deleted?): dropped"],
        id="owned-of-a-deleted-topic",
    ),
    pytest.param(
        {
            "assignor": "sticky",
            "partitions_per_topic": {"t": 2, "u": 2},
            "members": {
                "a": {"topics": ["t"], "owned": [["u", 0], ["u", 1]], "generation": 1},
                "b": {"topics": ["t", "u"], "generation": 1},
            },
        },
        {"a": [["t", 0], ["t", 1]], "b": [["u", 0], ["u", 1]]},
        [
            "kgo assign: members.a.owned[0]: topic 'u' is not subscribed: dropped",
            "kgo assign: members.a.owned[1]: topic 'u' is not subscribed: dropped",
        ],
        id="owned-of-an-unsubscribed-topic",
    ),
    pytest.param(
        {**ONE_TOPIC, "members": {"m": {"topics": ["t"], "owned": [["t", 0], ["t", 0]]}}},
        {"m": [["t", 0], ["t", 1], ["t", 2]]},
        ["kgo assign: members.m.owned[1]: 't' 0 listed again: counted once"],
        id="owned-twice",
    ),
    pytest.param(
        # AbstractStickyAssignorTest's
        # testPartitionsTransferringOwnershipIncludeThePartitionClaimedByMultipleConsumers
        # InSameGeneration: t-0 is claimed by c1 and c2 at one generation; taken from both,
        # it goes to c3.
        {
            **ONE_TOPIC,
            "assignor": "sticky",
            "members": {
                "c1": {"topics": ["t"], "owned": [["t", 0], ["t", 1]], "generation": 1},
                "c2": {"topics": ["t"], "owned": [["t", 0], ["t", 2]], "generation": 1},
                "c3": {"topics": ["t"], "generation": 1},
            },
        },
        {"c1": [["t", 1]], "c2": [["t", 2]], "c3": [["t", 0]]},
        ["kgo assign: 't' 0 is claimed by 'c1', 'c2' at generation 1: taken from all of them"],
        id="claimed-by-two-members",
    ),
    pytest.param(
        # The same with the cooperative assignor: t-0 is held back one round (both holders
        # revoke it first), then goes to c3.
        {
            **ONE_TOPIC,
            "members": {
                "c1": {"topics": ["t"], "owned": [["t", 0], ["t", 1]]},
                "c2": {"topics": ["t"], "owned": [["t", 0], ["t", 2]]},
                "c3": {"topics": ["t"]},
            },
        },
        {"c1": [["t", 1]], "c2": [["t", 2]], "c3": []},
        ["kgo assign: 't' 0 is claimed by 'c1', 'c2' at no generation: taken from all of them"],
        id="claimed-by-two-members-cooperative",
    ),
]


@pytest.mark.parametrize(("document", "expected", "notes"), ODD_CLAIMS)
def test_odd_claims_are_handled_as_kafka_does_and_reported(
    document: object,
    expected: dict[str, Any],
    notes: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    err: list[str] = []
    code, output = run([], document, capsys, monkeypatch, stderr=err)
    assert code == 0
    assert output == {"assignment": expected}
    assert err == notes
