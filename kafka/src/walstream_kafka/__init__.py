"""walstream-kafka: a Kafka wire-protocol listener on walstream's streams.

``walstream serve`` starts it when the deployment has a ``kafka:`` section
(:mod:`walstream_kafka.extension`); docs/guides/kafka.md is the user's guide and
docs/reference/kafka-compatibility.md the compatibility ledger.
"""
