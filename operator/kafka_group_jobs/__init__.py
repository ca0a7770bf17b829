"""PySpark jobs over the coordinator's state topic: snapshot, compaction and restore.

Never imports kopf or ``kafka_group_operator``; the record codec comes from ``kafka_group_records``.
"""
