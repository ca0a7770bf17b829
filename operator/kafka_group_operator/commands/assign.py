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
nothing. Invalid input prints ``{"error": "..."}`` and exits with 2.
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
        text = _read(args.input)
        document = json.loads(text)
        name, spec, member_order = parse(document)
        assignor = assignors.get(args.assignor or name)
        if args.rounds:
            results = rounds.settle(assignor, spec)
            output: dict[str, Any] = {"rounds": [_render(r, member_order) for r in results]}
        else:
            output = {"assignment": _render(assignor.assign(spec), member_order)}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, InputError) as error:
        return _fail(f"invalid input: {error}")
    except rounds.UnsettledError as error:
        return _fail(str(error), code=1)
    except api.AssignorError as error:
        return _fail(str(error))
    print(json.dumps(output))
    return 0


def _fail(message: str, code: int = INVALID_INPUT) -> int:
    print(json.dumps({"error": message}))
    return code


def _read(path: str | None) -> str:
    if path is None:
        return sys.stdin.read()
    with open(path, encoding="utf-8") as source:
        return source.read()


def _render(assignment: api.GroupAssignment, member_order: list[str]) -> dict[str, Any]:
    return {
        member: [list(partition) for partition in assignment[member]] for member in member_order
    }


def parse(document: object) -> tuple[str, api.GroupSpec, list[str]]:
    """The assignor name, the group and the members in input order; raises InputError."""
    top = _object(document, "the input")
    _no_unknown(top, TOP_LEVEL_FIELDS, "the input")
    name = top.get("assignor", DEFAULT_ASSIGNOR)
    if not isinstance(name, str):
        raise InputError("assignor must be a string")
    counts: dict[str, int] = {}
    for topic, count in _object(top.get("partitions_per_topic"), "partitions_per_topic").items():
        counts[topic] = _count(count, f"partitions_per_topic.{topic}")
    partition_racks = _partition_racks(top.get("partition_racks", {}), counts)
    members: dict[str, api.MemberSubscription] = {}
    for member_id, member in _object(top.get("members"), "members").items():
        members[member_id] = _member(member, f"members.{member_id}")
    spec = api.GroupSpec(
        members=members, partitions_per_topic=counts, partition_racks=partition_racks
    )
    return name, spec, list(members)


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
    return value


def _count(value: object, where: str) -> int:
    count = _integer(value, where)
    if count < 0:
        raise InputError(f"{where} must not be negative")
    return count


def _optional_string(value: object, where: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InputError(f"{where} must be a string or null")
    return value


def _strings(value: object, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise InputError(f"{where} must be a list of strings")
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


def _member(value: object, where: str) -> api.MemberSubscription:
    member = _object(value, where)
    _no_unknown(member, MEMBER_FIELDS, where)
    if "topics" not in member:
        raise InputError(f"{where}.topics is required")
    topics = frozenset(_strings(member["topics"], f"{where}.topics"))
    owned_value = member.get("owned", [])
    if not isinstance(owned_value, list):
        raise InputError(f"{where}.owned must be a list of [topic, partition] pairs")
    owned = []
    for index, pair in enumerate(owned_value):
        place = f"{where}.owned[{index}]"
        if not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[0], str):
            raise InputError(f"{place} must be a [topic, partition] pair")
        owned.append((pair[0], _count(pair[1], place)))
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
