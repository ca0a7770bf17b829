"""kafka-group-operator: a Kubernetes operator that is the group coordinator for Kafka consumer groups.

Importing this package has no side effects; the subpackages say what they do and may import.
"""
