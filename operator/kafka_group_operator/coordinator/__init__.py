"""The sans-IO group coordinator: requests in, records and responses out.

Handlers validate a request against the current state and return the records that express the
change plus the response; only replay of a record mutates state, so loading the state topic
at start-up and applying live writes share one code path. No asyncio, no Kafka client here.
"""
