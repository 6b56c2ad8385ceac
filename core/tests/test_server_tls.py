"""``server.tls``: ``walstream serve`` over HTTPS, HTTP/1.1 and HTTP/2 chosen by ALPN, with a
certificate the test makes (``cryptography``): curl and S2's Python SDK talk to it; with
``client_ca`` a client without a certificate that CA signed is refused."""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from walstream.errors import ConfigError
from walstream.server.serve import serve
from walstream_conformance.harness.serve import WalstreamServe

TOKEN = "tls-token"
BASIN = "tls-basin"
CURL = shutil.which("curl")


@dataclass(frozen=True)
class Pki:
    ca: Path
    certificate: Path
    key: Path
    client_certificate: Path
    client_key: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _issue(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
    server: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA, a server certificate for localhost and 127.0.0.1, and a client certificate."""
    folder = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "walstream test CA")])
    ca = _issue("walstream test CA", ca_key, ca_name, ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _issue("localhost", server_key, ca_name, ca_key, ca=False, server=True)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _issue("a client", client_key, ca_name, ca_key, ca=False)
    pki = Pki(
        folder / "ca.pem",
        folder / "server.pem",
        folder / "server.key",
        folder / "client.pem",
        folder / "client.key",
    )
    pki.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.certificate.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.key, server_key)
    pki.client_certificate.write_bytes(client.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.client_key, client_key)
    return pki


def _deployment(folder: Path, tls: str) -> Path:
    path = folder / "deploy.yaml"
    path.write_text(
        "node: {id: 1}\n"
        f"wal: {{type: memory, name: tls-{folder.name}}}\n"
        "object_store: {type: local, root: data/objects, fsync: false}\n"
        "metadata: {type: sqlite, path: data/meta.db}\n"
        f"server: {{tls: {tls}}}\n"
    )
    return path


@pytest.fixture(scope="module")
def https_url(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("tls-serve")
    deployment = _deployment(folder, f"{{certificate: {pki.certificate}, key: {pki.key}}}")
    server = WalstreamServe(deployment, token=TOKEN)
    server.start()
    try:
        assert "listening on https://127.0.0.1:" in server.banner, server.banner
        yield server.url
    finally:
        server.stop_cleanly()


def curl(*arguments: str) -> subprocess.CompletedProcess[str]:
    assert CURL is not None
    return subprocess.run(
        [CURL, "--silent", "--show-error", "--max-time", "20", *arguments],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.skipif(CURL is None, reason="needs curl")
@pytest.mark.parametrize(("flag", "version"), [("--http1.1", "1.1"), ("--http2", "2")])
def test_curl_talks_https_over_http1_and_http2(
    https_url: str, pki: Pki, flag: str, version: str
) -> None:
    answer = curl(
        flag, "--cacert", str(pki.ca), "--write-out", "\n%{http_version}", https_url + "/health"
    )
    assert answer.returncode == 0, answer.stderr
    body, _, used = answer.stdout.rpartition("\n")
    assert used == version
    assert '"status":"ok"' in body
    # The token still applies over TLS.
    refused = curl(
        flag, "--cacert", str(pki.ca), "--write-out", "%{http_code}", https_url + "/v1/basins"
    )
    assert refused.stdout.endswith("401")


@pytest.mark.skipif(CURL is None, reason="needs curl")
def test_a_client_that_does_not_trust_the_certificate_gets_no_answer(https_url: str) -> None:
    answer = curl(https_url + "/health")
    assert answer.returncode != 0
    assert "certificate" in answer.stderr.lower()
    cleartext = curl("http://" + https_url.removeprefix("https://") + "/health")
    assert cleartext.returncode != 0 or '"status":"ok"' not in cleartext.stdout


async def test_the_s2_sdk_appends_and_reads_over_https(
    https_url: str, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    s2_sdk = pytest.importorskip("s2_sdk")
    # The SDK trusts the default verify paths: point them at the test's CA.
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca))
    client = s2_sdk.S2(TOKEN, endpoints=s2_sdk.Endpoints(account=https_url, basin=https_url))
    try:
        await client.create_basin(BASIN)
        basin = client.basin(BASIN)
        await basin.create_stream("secure")
        stream = basin.stream("secure")
        ack = await stream.append(
            s2_sdk.AppendInput(records=[s2_sdk.Record(body=b"over tls"), s2_sdk.Record(body=b"2")])
        )
        assert (ack.start.seq_num, ack.end.seq_num) == (0, 2)
        batch = await stream.read(start=s2_sdk.SeqNum(0))
        assert [record.body for record in batch.records] == [b"over tls", b"2"]
    finally:
        await client.close()


@pytest.fixture
async def mutual_tls_url(tmp_path: Path, pki: Pki) -> AsyncIterator[str]:
    deployment = _deployment(
        tmp_path,
        f"{{certificate: {pki.certificate}, key: {pki.key}, client_ca: {pki.ca}}}",
    )
    async with serve(deployment, listen="127.0.0.1:0", token=TOKEN, environ={}) as running:
        assert running.url.startswith("https://")
        yield running.url


@pytest.mark.skipif(CURL is None, reason="needs curl")
async def test_with_a_client_ca_only_clients_with_its_certificates_are_served(
    mutual_tls_url: str, pki: Pki
) -> None:
    import asyncio

    without = await asyncio.to_thread(curl, "--cacert", str(pki.ca), mutual_tls_url + "/health")
    assert without.returncode != 0
    with_certificate = await asyncio.to_thread(
        curl,
        "--cacert",
        str(pki.ca),
        "--cert",
        str(pki.client_certificate),
        "--key",
        str(pki.client_key),
        mutual_tls_url + "/health",
    )
    assert with_certificate.returncode == 0, with_certificate.stderr
    assert '"status":"ok"' in with_certificate.stdout


async def test_a_key_that_does_not_match_is_a_config_error(tmp_path: Path, pki: Pki) -> None:
    deployment = _deployment(tmp_path, f"{{certificate: {pki.certificate}, key: {pki.client_key}}}")
    with pytest.raises(ConfigError, match=r"server\.tls: cannot load certificate"):
        async with serve(deployment, listen="127.0.0.1:0", environ={}):
            pass


async def test_a_missing_file_or_key_is_a_config_error(tmp_path: Path, pki: Pki) -> None:
    deployment = _deployment(tmp_path, f"{{certificate: {tmp_path / 'nope.pem'}, key: {pki.key}}}")
    with pytest.raises(ConfigError, match=r"server\.tls\.certificate"):
        async with serve(deployment, listen="127.0.0.1:0", environ={}):
            pass
    deployment = _deployment(tmp_path, f"{{certificate: {pki.certificate}}}")
    with pytest.raises(ConfigError, match=r"server\.tls\.key"):
        async with serve(deployment, listen="127.0.0.1:0", environ={}):
            pass
