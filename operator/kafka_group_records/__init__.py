"""Records of the coordinator's state topic and their Kafka binary codec.

Shared by the operator (``kafka_group_operator``) and the Spark jobs (``kafka_group_jobs``),
which may not import each other. Pure: no I/O, no third-party imports.
"""
