"""``kgo assign``: run a partition assignor on a JSON description of a group.

Input (stdin, or ``--input FILE``)::

    {"assignor": "cooperative-sticky",
     "partitions_per_topic": {"t1": 3, "t2": 2},
     "partition_racks": {"t1": [["a"], ["b"], ["c"]]},
     "members": {"m1": {"topics": ["t1", "t2"], "owned": [["t1", 0]], "generation": 1,
                        "rack": "a", "instance_id": "grp-0"}}}

Only ``topics`` is required per member; ``partition_racks`` gives the replica racks of each
partition. Output: ``{"assignment": {"m1": [["t1", 0], ...]}}``, or with ``--rounds``
``{"rounds": [...]}``, one member -> partitions object per round until a round revokes
nothing. Invalid input prints one line, ``{"error": "..."}``, and exits with 2.

Input is hostile until checked: at most 32 MiB of strict UTF-8 JSON, no lone surrogates in
strings, integers of at most 20 digits, at most 1,000,000 partitions in all (a topic's count
and partition numbers are Kafka's int32s).

Owned partitions are what members report, and Kafka's assignors take them as they come:
claims of a topic that is not in partitions_per_topic (deleted) or beyond its partitions
are dropped; a partition two members claim at the same generation is taken from both
(AbstractStickyAssignor); of claims at different generations the highest keeps it (a stale
owner). Each dropped or contested claim is reported on stderr, and the assignment goes on.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any

from kafka_group_operator import assignors
from kafka_group_operator.assignors import api, rounds

DEFAULT_ASSIGNOR = "cooperative-sticky"
INVALID_INPUT = 2
MAX_INPUT_BYTES = 32 * 1024 * 1024
MAX_PARTITIONS = 1_000_000
MAX_INT_DIGITS = 20  # an int64 with its sign; the fields themselves are int32
INT32_MAX = 2**31 - 1
MEMBER_FIELDS = frozenset({"topics", "owned", "generation", "rack", "instance_id"})
TOP_LEVEL_FIELDS = frozenset({"assignor", "partitions_per_topic", "partition_racks", "members"})


class InputError(ValueError):
    """The JSON does not describe a group."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "assign",
        help="assign partitions to members with one of the assignors",
        description=(__doc__ or "").replace("``", "").replace("::", ":"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--input", metavar="FILE", help="read the group from FILE, not stdin")
    parser.add_argument(
        "--assignor",
        metavar="NAME",
        help=f"override the input's assignor ({', '.join(assignors.ASSIGNORS)}; "
        f"default {DEFAULT_ASSIGNOR})",
    )
    parser.add_argument(
        "--rounds", action="store_true", help="repeat rounds until one revokes nothing"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        document = _decode(_read(args.input))
        dropped: list[str] = []
        name, spec, member_order = parse(document, dropped)
        assignor = assignors.get(args.assignor or name)
        if args.rounds:
            results = rounds.settle(assignor, spec)
            output: dict[str, Any] = {"rounds": [_render(r, member_order) for r in results]}
        else:
            output = {"assignment": _render(assignor.assign(spec), member_order)}
    except OSError as error:
        return _fail(f"invalid input: {error.strerror or error}: {error.filename or 'stdin'}")
    except InputError as error:
        return _fail(f"invalid input: {error}")
    except rounds.UnsettledError as error:
        return _fail(str(error), code=1)
    except api.AssignorError as error:
        return _fail(str(error))
    for note in dropped:
        print(f"kgo assign: {note}", file=sys.stderr)
    print(json.dumps(output))
    return 0


def _fail(message: str, code: int = INVALID_INPUT) -> int:
    print(json.dumps({"error": message}))
    return code


def _read(path: str | None) -> bytes:
    """At most ``MAX_INPUT_BYTES`` of stdin or ``path``, as bytes: decoding is ours."""
    if path is None:
        data: bytes = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
    else:
        with open(path, "rb") as source:
            data = source.read(MAX_INPUT_BYTES + 1)
    if len(data) > MAX_INPUT_BYTES:
        raise InputError(f"more than {MAX_INPUT_BYTES} bytes")
    return data


def _decode(data: bytes) -> object:
    """The JSON document in ``data``; every way it can be malformed is an ``InputError``."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(f"not UTF-8: byte {error.start} ({error.reason})") from None
    try:
        return json.loads(text, parse_int=_parse_int, parse_constant=_parse_constant)
    except json.JSONDecodeError as error:
        raise InputError(f"not JSON: {error}") from None
    except RecursionError:
        raise InputError("not JSON this service reads: nested too deeply") from None


def _parse_int(text: str) -> int:
    # Python refuses to convert very long digit strings (and is slow on long ones).
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise InputError(f"a number of {len(text)} digits; integers have at most 20")
    return int(text)


def _parse_constant(text: str) -> object:
    raise InputError(f"not JSON: {text} is not a JSON number")


def _render(assignment: api.GroupAssignment, member_order: list[str]) -> dict[str, Any]:
    return {
        member: [list(partition) for partition in assignment[member]] for member in member_order
    }


def parse(
    document: object, dropped: list[str] | None = None
) -> tuple[str, api.GroupSpec, list[str]]:
    """The assignor name, the group and the members in input order; raises InputError.

    Claims the assignors drop or take from their claimants are described in ``dropped``.
    """
    notes: list[str] = [] if dropped is None else dropped
    top = _object(document, "the input")
    _no_unknown(top, TOP_LEVEL_FIELDS, "the input")
    name = _string(top.get("assignor", DEFAULT_ASSIGNOR), "assignor")
    counts: dict[str, int] = {}
    for topic, count in _object(top.get("partitions_per_topic"), "partitions_per_topic").items():
        where = f"partitions_per_topic.{_string(topic, 'a topic name')}"
        counts[topic] = _count(count, where, INT32_MAX)
    total = sum(counts.values())
    if total > MAX_PARTITIONS:
        raise InputError(f"{total} partitions in all; at most {MAX_PARTITIONS}")
    partition_racks = _partition_racks(top.get("partition_racks", {}), counts)
    members: dict[str, api.MemberSubscription] = {}
    for member_id, member in _object(top.get("members"), "members").items():
        where = f"members.{_string(member_id, 'a member id')}"
        members[member_id] = _member(member, where, counts, notes)
    _note_double_claims(members, notes)
    spec = api.GroupSpec(
        members=members, partitions_per_topic=counts, partition_racks=partition_racks
    )
    return name, spec, list(members)


def _note_double_claims(members: Mapping[str, api.MemberSubscription], notes: list[str]) -> None:
    """Describe the partitions two members claim at one generation: the assignors take them
    from both (Kafka's ``partitionsWithMultiplePreviousOwners``)."""
    claimed: dict[tuple[api.TopicPartition, int | None], list[str]] = {}
    for member_id, member in members.items():
        for claim in member.owned:
            claimed.setdefault((claim, member.generation), []).append(member_id)
    for ((topic, partition), generation), claimants in claimed.items():
        if len(claimants) > 1:
            at = "no generation" if generation is None else f"generation {generation}"
            names = ", ".join(repr(claimant) for claimant in claimants)
            notes.append(
                f"{topic!r} {partition} is claimed by {names} at {at}: taken from all of them"
            )


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InputError(f"{where} must be an object")
    return value


def _no_unknown(value: Mapping[str, Any], known: frozenset[str], where: str) -> None:
    unknown = sorted(set(value) - known)
    if unknown:
        raise InputError(f"{where} has unknown field(s): {', '.join(unknown)}")


def _integer(value: object, where: str) -> int:
    # bool is an int in Python but not in JSON.
    if not isinstance(value, int) or isinstance(value, bool):
        raise InputError(f"{where} must be an integer")
    if not -INT32_MAX - 1 <= value <= INT32_MAX:
        raise InputError(f"{where} is {value}, outside Kafka's int32")
    return value


def _count(value: object, where: str, limit: int) -> int:
    count = _integer(value, where)
    if count < 0:
        raise InputError(f"{where} must not be negative")
    if count > limit:
        raise InputError(f"{where} is {count}, more than {limit}")
    return count


def _string(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise InputError(f"{where} must be a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        # JSON's \ud800 escapes can spell a lone surrogate, which is not text.
        raise InputError(f"{where} is not valid Unicode (a lone surrogate)") from None
    return value


def _optional_string(value: object, where: str) -> str | None:
    return None if value is None else _string(value, where)


def _strings(value: object, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise InputError(f"{where} must be a list of strings")
    for index, item in enumerate(value):
        _string(item, f"{where}[{index}]")
    return value


def _partition_racks(value: object, counts: Mapping[str, int]) -> dict[str, list[frozenset[str]]]:
    result: dict[str, list[frozenset[str]]] = {}
    for topic, per_partition in _object(value, "partition_racks").items():
        where = f"partition_racks.{topic}"
        if topic not in counts:
            raise InputError(f"{where}: topic is not in partitions_per_topic")
        if not isinstance(per_partition, list) or len(per_partition) != counts[topic]:
            raise InputError(
                f"{where} must list the racks of each of its {counts[topic]} partitions"
            )
        result[topic] = [
            frozenset(_strings(racks, f"{where}[{index}]"))
            for index, racks in enumerate(per_partition)
        ]
    return result


def _member(
    value: object, where: str, counts: Mapping[str, int], notes: list[str]
) -> api.MemberSubscription:
    member = _object(value, where)
    _no_unknown(member, MEMBER_FIELDS, where)
    if "topics" not in member:
        raise InputError(f"{where}.topics is required")
    topics = frozenset(_strings(member["topics"], f"{where}.topics"))
    owned_value = member.get("owned", [])
    if not isinstance(owned_value, list):
        raise InputError(f"{where}.owned must be a list of [topic, partition] pairs")
    owned: list[api.TopicPartition] = []
    seen: set[api.TopicPartition] = set()
    if len(owned_value) > MAX_PARTITIONS:
        raise InputError(f"{where}.owned lists more than {MAX_PARTITIONS} partitions")
    for index, pair in enumerate(owned_value):
        place = f"{where}.owned[{index}]"
        if not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[0], str):
            raise InputError(f"{place} must be a [topic, partition] pair")
        topic = _string(pair[0], place)
        partition = _integer(pair[1], place)
        if topic not in counts:
            notes.append(f"{place}: topic {topic!r} has no partitions (deleted?): dropped")
            continue
        if not 0 <= partition < counts[topic]:
            notes.append(
                f"{place}: {topic!r} has partitions 0 to {counts[topic] - 1}, not {partition}: "
                "dropped"
            )
            continue
        if (topic, partition) in seen:
            notes.append(f"{place}: {topic!r} {partition} listed again: counted once")
            continue
        if topic not in topics:
            notes.append(f"{place}: topic {topic!r} is not subscribed: dropped")
        seen.add((topic, partition))
        owned.append((topic, partition))
    generation = member.get("generation")
    if generation is not None:
        generation = _integer(generation, f"{where}.generation")
    return api.MemberSubscription(
        topics=topics,
        owned=tuple(owned),
        generation=generation,
        rack=_optional_string(member.get("rack"), f"{where}.rack"),
        instance_id=_optional_string(member.get("instance_id"), f"{where}.instance_id"),
    )
