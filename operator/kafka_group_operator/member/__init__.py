"""The member library used by consumer pods: follows the embedded coordinator's heartbeats.

Needs only the base install (confluent-kafka and the standard library)::

    from kafka_group_operator.member import GroupMember, MemberConfig

    with GroupMember(MemberConfig.from_env()) as member:
        member.install_signal_handlers()
        for message in member:
            handle(message)
"""

from kafka_group_operator.member.config import ConfigError, MemberConfig
from kafka_group_operator.member.group_member import GroupMember, MemberError

__all__ = ["ConfigError", "GroupMember", "MemberConfig", "MemberError"]
