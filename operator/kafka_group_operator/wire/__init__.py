"""Kafka's wire format and the operator's own client connections to Kafka brokers.

Below the runtime and the Kafka-protocol front doors, which share it: framing and kio
(de)serialisation (``framing``, ``tagged``), connections to brokers with TLS and SASL
(``connection``), and the offset mirror's member-less commits (``offset_commits``).
"""
