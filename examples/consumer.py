"""An example consumer for a ConsumerGroup pod: count words in the messages of its partitions.

The operator injects everything the member needs into the pod's environment (group id,
coordinator URL and token, pod name as the static instance id, topics, bootstrap servers,
Kafka client settings), so the application only iterates. Run it outside Kubernetes with the
same variables: ``kgo dev up`` starts a broker and a coordinator and prints them (the group's
token included); each copy needs its own instance id, as each pod has its name::

    eval "$(kgo dev up)"
    KGO_INSTANCE_ID=orders-0 python examples/consumer.py
"""

from __future__ import annotations

import collections
import logging

from kafka_group_operator.member import ConfigError, GroupMember, MemberConfig

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
log = logging.getLogger("consumer")


def main() -> None:
    words: collections.Counter[str] = collections.Counter()

    def revoked(partitions: frozenset[tuple[str, int]]) -> None:
        # Offsets processed so far are committed before the partitions are released.
        log.info("handing over %s; top words so far: %s", sorted(partitions), words.most_common(3))

    def lost(partitions: frozenset[tuple[str, int]]) -> None:
        # No commit: the member could not prove it still owned them (fenced, cut off from the
        # coordinator, or frozen past its deadline), and another member may have them already.
        log.warning("lost %s: uncommitted messages will be processed again", sorted(partitions))

    try:
        config = MemberConfig.from_env()
    except ConfigError as error:
        # A missing or wrong variable is one line, not a traceback.
        raise SystemExit(f"consumer: {error}") from None
    with GroupMember(config, on_revoked=revoked, on_lost=lost) as member:
        # SIGTERM (pod deletion, rolling update): finish the message in hand, commit, and
        # leave temporarily, so a restart within the session timeout keeps the partitions.
        member.install_signal_handlers()
        for message in member:
            # A message counts as processed once the loop asks for the next one; offsets are
            # committed every few seconds and whenever a partition is revoked.
            words.update((message.value() or b"").decode(errors="replace").split())
            if (message.offset() or 0) % 1000 == 0:
                member.commit(asynchronous=True)


if __name__ == "__main__":
    main()
