"""An unmodified Kafka client for the gateway's end-to-end test: the README's plain
confluent-kafka consumer (KIP-848 protocol, a commit after each message), importing nothing of
this project. It reads the three variables the operator injects, and its topic from ``TOPIC``;
each message it processed and each commit it saw acknowledged is one JSON line."""

import json
import os
import signal
import threading
import time

from confluent_kafka import Consumer, KafkaException

consumer = Consumer(
    {
        "bootstrap.servers": os.environ["KAFKA_BOOTSTRAP_SERVERS"],
        "group.id": os.environ["KAFKA_GROUP_ID"],
        "group.instance.id": os.environ["KAFKA_GROUP_INSTANCE_ID"],
        "group.protocol": "consumer",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
consumer.subscribe([os.environ["TOPIC"]])
try:
    while not stop.is_set():
        message = consumer.poll(1.0)
        if message is None or message.error():
            continue
        where = f"{message.topic()}:{message.partition()}"
        print(json.dumps({"event": "processed", "partition": where, "offset": message.offset()}))
        try:
            consumer.commit(message, asynchronous=False)
        except KafkaException as error:
            print(json.dumps({"event": "commit-failed", "error": str(error)}), flush=True)
            continue
        print(
            json.dumps(
                {"event": "committed", "at": time.time(), "offsets": {where: message.offset() + 1}}
            ),
            flush=True,
        )
finally:
    consumer.close()
