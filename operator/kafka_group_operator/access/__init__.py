"""What both front doors need, below both: the groups' tokens and who serves a group.

The HTTP member API (``api``) and the Kafka-protocol listener (``protocol``) authenticate the
same per-group tokens (``tokens``) and name the same coordinator of a group (``discovery``).
Neither front door imports the other; both import this package, which imports neither.
"""
