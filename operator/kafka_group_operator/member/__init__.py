"""The member library used by consumer pods: follows the embedded coordinator's heartbeats.

Needs only the base install (confluent-kafka and the standard library).
"""
