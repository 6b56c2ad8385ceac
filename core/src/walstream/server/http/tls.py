"""TLS for the listener (``server.tls``): the server's :class:`ssl.SSLContext`, offering HTTP/2
and HTTP/1.1 by ALPN (RFC 7301; HTTP/2 over TLS needs TLS 1.2 or later, RFC 9113 9.2), and
asking for client certificates when ``client_ca`` is set."""

from __future__ import annotations

import ssl

from walstream.errors import ConfigError
from walstream.server.limits import TlsSettings

__all__ = ["ALPN_PROTOCOLS", "server_context"]

#: What the listener offers, in its order of preference.
ALPN_PROTOCOLS = ("h2", "http/1.1")


def server_context(settings: TlsSettings) -> ssl.SSLContext:
    """The server's context: TLS 1.2 or later, ALPN ``h2`` then ``http/1.1``, the certificate
    and key of ``settings``, and client certificates required when ``client_ca`` is set.
    Unreadable or mismatched files are a :class:`~walstream.errors.ConfigError`."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(list(ALPN_PROTOCOLS))
    try:
        context.load_cert_chain(str(settings.certificate), str(settings.key))
    except (OSError, ssl.SSLError) as error:
        raise ConfigError(
            f"server.tls: cannot load certificate {settings.certificate} with key "
            f"{settings.key} ({error}); give PEM files, the key matching the certificate"
        ) from None
    if settings.client_ca is not None:
        try:
            context.load_verify_locations(cafile=str(settings.client_ca))
        except (OSError, ssl.SSLError) as error:
            raise ConfigError(
                f"server.tls.client_ca: cannot load {settings.client_ca} ({error}); give a PEM "
                "CA bundle"
            ) from None
        context.verify_mode = ssl.CERT_REQUIRED
    else:
        context.verify_mode = ssl.CERT_NONE
    return context
