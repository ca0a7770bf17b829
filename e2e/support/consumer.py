"""The consumer pods' command in the end-to-end tests: ``examples/consumer.py``'s loop on the
member library, with every acknowledged commit, every failed one, and every assigned, revoked
and lost partition printed as one JSON line, so that a test counts them exactly from the pod's
log (``kubectl logs``). Its configuration is the pod's environment, as the operator injects it.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping

from kafka_group_operator.member import ConfigError, GroupMember, MemberConfig

Partitions = frozenset[tuple[str, int]]


def emit(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, "at": time.time(), **fields}), flush=True)


def names(partitions: Partitions) -> list[str]:
    return sorted(f"{topic}:{partition}" for topic, partition in partitions)


def main() -> None:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stdout,
    )
    try:
        config = MemberConfig.from_env()
    except ConfigError as error:
        raise SystemExit(f"consumer: {error}") from None

    def committed(
        pending: Mapping[tuple[str, int], int], failed: Mapping[tuple[str, int], str]
    ) -> None:
        emit(
            "committed",
            offsets={f"{t}:{p}": o for (t, p), o in pending.items() if (t, p) not in failed},
            failed={f"{t}:{p}": error for (t, p), error in failed.items()},
        )

    with GroupMember(
        config,
        on_assigned=lambda partitions: emit("assigned", partitions=names(partitions)),
        on_revoked=lambda partitions: emit("revoked", partitions=names(partitions)),
        on_lost=lambda partitions: emit("lost", partitions=names(partitions)),
        on_commit=committed,
    ) as member:
        member.install_signal_handlers()
        for message in member:
            emit(
                "processed",
                partition=f"{message.topic()}:{message.partition()}",
                offset=message.offset(),
            )


if __name__ == "__main__":
    main()
