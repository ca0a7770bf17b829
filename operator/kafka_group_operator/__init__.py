"""kafka-group-operator: the Kubernetes operator that is the Kafka consumer-group coordinator.

Importing this package has no side effects; the subpackages say what they do and may import.
"""
