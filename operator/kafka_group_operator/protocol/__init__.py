"""Kafka wire protocol: the coordinator listener and the gateway (types from ``kio``)."""
