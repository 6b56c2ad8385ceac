"""The ``kafka:`` section of a deployment and the listener ``walstream serve`` starts from it
(the entry point ``walstream.listeners: kafka``). This module imports nothing heavy: the plugin
host loads it to validate deployments.

```yaml
kafka:
  listen: 0.0.0.0:9092          # where the listener binds (port 0: any free port)
  advertise: kafka1.example:9092 # what Metadata tells clients (default: listen's)
```

The ``server:`` section's bounds apply here too unless the section sets its own
(``max_connections_per_address``, ``send_timeout``), and ``server.tls`` makes this listener
speak TLS with the same certificate (``tls: false`` keeps it cleartext).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from walstream.config.listeners import ExtraListener, ListenerContext
from walstream.config.options import Option
from walstream.errors import ConfigError

__all__ = ["LISTENER", "KafkaExtension", "parse_address"]

OPTIONS: tuple[Option, ...] = (
    Option("listen", "str", "host:port the Kafka listener binds", default="127.0.0.1:9092"),
    Option(
        "advertise",
        "str",
        "host:port Kafka clients are told to connect to (Metadata); default: listen's, which "
        "must then name a host clients can reach",
    ),
    Option(
        "default_partitions",
        "int",
        "partitions of a topic created without a count (auto-created, or num_partitions -1)",
        default=1,
        minimum=1,
    ),
    Option(
        "auto_create_topics",
        "bool",
        "create a topic when a client asks Metadata for one that does not exist",
        default=True,
    ),
    Option(
        "max_request_size",
        "size",
        "largest request frame accepted; a larger one closes the connection",
        default=100 << 20,
        minimum=1024,
    ),
    Option(
        "max_in_flight",
        "int",
        "requests of one connection in progress at once (reading waits beyond)",
        default=32,
        minimum=1,
    ),
    Option(
        "max_connections",
        "int",
        "connections open at once; more are closed",
        default=1024,
        minimum=1,
    ),
    Option(
        "max_connections_per_address",
        "int",
        "connections one remote address may hold open at once; more are closed (default: "
        "server.max_connections_per_address)",
        minimum=1,
    ),
    Option(
        "idle_timeout",
        "duration",
        "close a connection that sends nothing this long",
        default=600.0,
        minimum=0.001,
    ),
    Option(
        "send_timeout",
        "duration",
        "close a connection that takes none of an answer's bytes this long (default: "
        "server.send_timeout)",
        minimum=0.001,
    ),
    Option(
        "tls",
        "bool",
        "speak TLS (clients' SSL / SASL_SSL) with server.tls's certificate when server.tls is "
        "set; false: cleartext even then",
        default=True,
    ),
)


def parse_address(value: str, key: str) -> tuple[str, int]:
    host, separator, port = value.rpartition(":")
    host = host.strip("[]")
    if not separator or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{key}: expected host:port such as 127.0.0.1:9092, got {value!r}")
    return host, int(port)


class KafkaExtension:
    """The ``kafka`` listener (:class:`walstream.config.listeners.ListenerExtension`)."""

    description = "Kafka wire protocol: Kafka clients produce to and consume from walstream streams"
    options = OPTIONS

    def check(self, section: Mapping[str, Any]) -> None:
        host, _port = parse_address(section["listen"], "kafka.listen")
        advertise = section.get("advertise")
        if advertise is not None:
            _host, advertised_port = parse_address(advertise, "kafka.advertise")
            if advertised_port == 0:
                raise ConfigError("kafka.advertise: the advertised port cannot be 0")
        elif host in ("0.0.0.0", "::"):
            raise ConfigError(
                f"kafka.advertise: required when kafka.listen binds every address ({host}): "
                "name the host:port clients connect to"
            )

    async def start(self, context: ListenerContext) -> ExtraListener:
        from walstream.server.http.tls import server_context
        from walstream.server.limits import limits_from_section

        from walstream_kafka.broker import BrokerAddress, KafkaBroker
        from walstream_kafka.kv import open_kv
        from walstream_kafka.server import KafkaListener, ListenerLimits

        section = context.section
        server_limits = limits_from_section(context.deployment.sections.get("server") or {})
        host, port = parse_address(section["listen"], "kafka.listen")
        broker_host, broker_port = host, port
        if section.get("advertise") is not None:
            broker_host, broker_port = parse_address(section["advertise"], "kafka.advertise")
        limits = ListenerLimits(
            max_request_bytes=int(section["max_request_size"]),
            max_in_flight=int(section["max_in_flight"]),
            max_connections=int(section["max_connections"]),
            max_connections_per_address=int(
                section.get("max_connections_per_address")
                or server_limits.max_connections_per_address
            ),
            idle_timeout_s=float(section["idle_timeout"]),
            send_timeout_s=float(section.get("send_timeout") or server_limits.send_timeout_s),
            tls=(
                server_context(server_limits.tls)
                if section["tls"] and server_limits.tls is not None
                else None
            ),
        )
        client = context.client
        placeholder = BrokerAddress(client.node_id, broker_host, broker_port)
        broker = KafkaBroker(
            client,
            open_kv(client.metadata),
            advertise=placeholder,
            default_partitions=int(section["default_partitions"]),
            auto_create_topics=bool(section["auto_create_topics"]),
            token=context.token,
        )
        listener = KafkaListener(broker, limits)
        await listener.start(host, port)
        if broker_port == 0:  # listen on port 0 without advertise: the port chosen
            broker.advertise = BrokerAddress(client.node_id, broker_host, listener.port)
        await broker.start()
        return listener


LISTENER = KafkaExtension()
