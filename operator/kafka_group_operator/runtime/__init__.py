"""The asyncio runtime around the sans-IO coordinator: state-topic writer, loader, timers.

The only place that produces to and consumes from the state topic (through confluent-kafka).
"""
