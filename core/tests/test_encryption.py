"""Streams written with a client key (walstream.encryption) through the Python API, on the
embedded deployment (an ``ebs`` WAL file, local object files, SQLite metadata): records come
back whole with the key and not at all without it or with another, the WAL file and the object
files hold no plaintext and no nonce twice, the key is stored nowhere, and the documented
format (``docs/architecture/encryption.md``) opens what was stored.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import walstream
from walstream import (
    Cipher,
    DecryptionFailed,
    EncryptionKey,
    EncryptionKeyRequired,
    InvalidArgument,
    Record,
)
from walstream.encryption import ENCRYPTED_HEADER, associated_data
from walstream.format.object import decode_block_records, parse_index
from walstream_conformance.harness.serve import WalstreamServe

MARKER = b"PLAINTEXT-MARKER-4f2a"


@pytest.fixture
async def client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[walstream.Client]:
    monkeypatch.chdir(tmp_path)
    async with walstream.open(None) as opened:
        yield opened


def new_key(cipher: Cipher) -> EncryptionKey:
    return EncryptionKey(cipher, os.urandom(32))


@pytest.mark.parametrize("cipher", list(Cipher))
async def test_records_round_trip_with_the_key(client: walstream.Client, cipher: Cipher) -> None:
    key = new_key(cipher)
    stream = await client.create_stream("secret")
    records = [
        Record(MARKER + b"-one", key=b"k1", headers=(("h", b"\x00v"), ("x", b"")), timestamp_ms=5),
        Record(b"", timestamp_ms=7),
        Record(MARKER * 100),
    ]
    ack = await stream.append(records, encryption=key)
    assert (ack.start, ack.end) == (0, 3)
    result = await stream.read(0, encryption=key)
    assert [(r.offset, r.value, r.key, r.headers) for r in result.records] == [
        (0, MARKER + b"-one", b"k1", (("h", b"\x00v"), ("x", b""))),
        (1, b"", None, ()),
        (2, MARKER * 100, None, ()),
    ]
    assert [r.timestamp_ms for r in result.records][:2] == [5, 7]
    # Reads by timestamp work: timestamps stay in the clear.
    by_time = await stream.read(from_timestamp=6, encryption=key)
    assert by_time.records[0].offset == 1
    followed = []
    async for record in stream.tail(0, encryption=key):
        followed.append(record.value)
        if len(followed) == 3:
            break
    assert followed[0] == MARKER + b"-one"


async def test_without_the_key_or_with_another_nothing_is_returned(
    client: walstream.Client,
) -> None:
    key = new_key(Cipher.AEGIS_256)
    stream = await client.create_stream("secret")
    await stream.append([Record(b"plain before")])
    await stream.append([Record(MARKER)], encryption=key)
    with pytest.raises(
        EncryptionKeyRequired, match="missing encryption key for stream cipher 'aegis-256'"
    ):
        await stream.read(0)
    assert [r.value for r in (await stream.read(0, limit_records=1)).records] == [b"plain before"]
    for wrong in (new_key(Cipher.AEGIS_256), EncryptionKey(Cipher.AES_256_GCM, key.secret)):
        with pytest.raises(DecryptionFailed):
            await stream.read(1, encryption=wrong)
    with pytest.raises(DecryptionFailed, match="not encrypted"):
        await stream.read(0, encryption=key)
    assert [r.value for r in (await stream.read(1, encryption=key)).records] == [MARKER]
    with pytest.raises(InvalidArgument, match="reserved"):
        await stream.append([Record(b"x", headers=((ENCRYPTED_HEADER, b"aegis-256"),))])


def test_keys_are_checked_and_never_shown() -> None:
    secret = os.urandom(32)
    key = EncryptionKey.parse("aes-256-gcm:" + base64.b64encode(secret).decode())
    assert key.cipher is Cipher.AES_256_GCM and key.secret == secret
    shown = repr(key) + str(key)
    assert base64.b64encode(secret).decode() not in shown and repr(secret) not in shown
    for text, message in (
        ("aegis-256:!!!!", "invalid base64"),
        ("aegis-256:" + base64.b64encode(b"short").decode(), "length"),
        ("rot13:" + base64.b64encode(secret).decode(), "cipher"),
        (base64.b64encode(secret).decode(), "CIPHER:BASE64"),
    ):
        with pytest.raises(InvalidArgument, match=message):
            EncryptionKey.parse(text)


def _stored_files(root: Path) -> list[Path]:
    return [path for path in root.rglob("*") if path.is_file()]


@pytest.mark.slow
async def test_stored_bytes_hold_no_plaintext_no_repeated_nonce_and_no_key(
    client: walstream.Client, tmp_path: Path
) -> None:
    """The WAL file, the object files and the metadata hold neither the plaintext nor the key;
    every record has its own nonce; the documented format opens the envelopes read from the
    object files with walstream's object decoder (what any reader of the bucket gets)."""
    keys = {cipher: new_key(cipher) for cipher in Cipher}
    stream = await client.create_stream("secret")
    for _ in range(20):
        for key in keys.values():
            batch = [Record(MARKER + b"-%d" % i, headers=(("h", MARKER),)) for i in range(10)]
            await stream.append(batch, encryption=key)
    # Before the upload, the records are in the WAL file.
    wal_bytes = (tmp_path / "walstream-data" / "wal.img").read_bytes()
    assert MARKER not in wal_bytes
    await client.flush()
    stored = _stored_files(tmp_path / "walstream-data")
    objects = [p for p in stored if "objects" in p.parts]
    assert objects, stored
    secrets = [k.secret for k in keys.values()]
    secrets += [base64.b64encode(s) for s in secrets]
    for path in stored:
        data = path.read_bytes()
        assert MARKER not in data, path
        assert not any(secret in data for secret in secrets), path

    envelopes: list[tuple[int, bytes]] = []
    for path in objects:
        data = path.read_bytes()
        index = parse_index(data, len(data))
        for entry in index.entries:
            block = data[entry.position : entry.position + entry.size]
            for record in decode_block_records(block, entry, index.block_crc_seed):
                assert record.headers[0][0] == ENCRYPTED_HEADER and record.key is None
                envelopes.append((entry.stream_id, record.value))
    assert len(envelopes) == 400
    nonces = [value[1 : 1 + (32 if value[0] == 1 else 12)] for _, value in envelopes]
    assert len(set(nonces)) == len(nonces)

    opened = [
        _documented_decrypt(
            value, keys[Cipher.AEGIS_256 if value[0] == 1 else Cipher.AES_256_GCM].secret, stream_id
        )
        for stream_id, value in envelopes
    ]
    assert sorted(v for _, _, v in opened) == sorted(
        MARKER + b"-%d" % i for i in range(10) for _ in range(40)
    )
    assert all(headers == [("h", MARKER)] and k is None for k, headers, _ in opened)
    assert associated_data(stream.stream_id) == b"walstream-record-v1" + stream.stream_id.to_bytes(
        8, "big"
    )


def _documented_decrypt(
    envelope: bytes, secret: bytes, stream_id: int
) -> tuple[bytes | None, list[tuple[str, bytes]], bytes]:
    """The standalone decryption of docs/architecture/encryption.md (run there by the docs
    harness too), written against the documented format only."""
    import struct

    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from nacl.bindings import crypto_aead_aegis256_decrypt

    aad = b"walstream-record-v1" + struct.pack(">q", stream_id)
    nonce_size = {1: 32, 2: 12}[envelope[0]]
    nonce, sealed = envelope[1 : 1 + nonce_size], envelope[1 + nonce_size :]
    if envelope[0] == 1:
        plain = crypto_aead_aegis256_decrypt(sealed, aad, nonce, secret)
    else:
        plain = AESGCM(secret).decrypt(nonce, sealed, aad)
    at = 1
    key = None
    if plain[0] & 1:
        (size,) = struct.unpack_from(">I", plain, at)
        key, at = plain[at + 4 : at + 4 + size], at + 4 + size
    (count,) = struct.unpack_from(">H", plain, at)
    at += 2
    headers = []
    for _ in range(count):
        (size,) = struct.unpack_from(">H", plain, at)
        name, at = plain[at + 2 : at + 2 + size].decode(), at + 2 + size
        (size,) = struct.unpack_from(">I", plain, at)
        headers.append((name, plain[at + 4 : at + 4 + size]))
        at += 4 + size
    return key, headers, plain[at:]


# -- the CLI ------------------------------------------------------------------------------------

_DEPLOYMENT = (
    "node: {id: 1}\n"
    "wal: {type: ebs, path: data/wal.img, capacity: 64MiB}\n"
    "object_store: {type: local, root: data/objects}\n"
    "metadata: {type: sqlite, path: data/meta.db}\n"
    "upload: {max_bytes: 64KiB, max_interval: 50ms}\n"
)


def _cli(folder: Path, *args: str, env: dict[str, str] | None = None, stdin: str = "") -> Any:
    walstream_cli = str(Path(sys.executable).with_name("walstream"))
    environment = {**os.environ, "WALSTREAM_ENCRYPTION_KEY": "", **(env or {})}
    return subprocess.run(
        [walstream_cli, "--config", str(folder / "deploy.yaml"), *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=folder,
        env=environment,
        timeout=120,
    )


def _values(result: Any) -> list[str]:
    return [json.loads(line)["value"] for line in result.stdout.splitlines()]


@pytest.mark.parametrize("through_server", [False, True], ids=["node", "live-server"])
@pytest.mark.slow
def test_the_cli_appends_and_reads_an_encrypted_stream_with_its_key_only(
    tmp_path: Path, through_server: bool
) -> None:
    """``--encryption-key CIPHER:BASE64`` (or ``$WALSTREAM_ENCRYPTION_KEY``) on append, read
    and tail; without it a read fails with EncryptionKeyRequired, with another key
    with DecryptionFailed, on the node itself and through a running ``walstream serve``."""
    (tmp_path / "deploy.yaml").write_text(_DEPLOYMENT)
    key = "aegis-256:" + base64.b64encode(os.urandom(32)).decode()
    other = "aegis-256:" + base64.b64encode(os.urandom(32)).decode()
    serve = WalstreamServe(tmp_path / "deploy.yaml") if through_server else None
    if serve is not None:
        serve.start()
    try:
        assert _cli(tmp_path, "streams", "create", "vault").returncode == 0
        appended = _cli(tmp_path, "append", "vault", "--encryption-key", key, stdin="one\ntwo\n")
        assert appended.returncode == 0, appended.stderr
        read = _cli(
            tmp_path, "read", "vault", "--format", "json", env={"WALSTREAM_ENCRYPTION_KEY": key}
        )
        assert read.returncode == 0, read.stderr
        assert _values(read) == ["one", "two"]
        tail = _cli(tmp_path, "tail", "vault", "--format", "json", "--encryption-key", key)
        assert _values(tail) == ["one", "two"]
        refused = _cli(tmp_path, "read", "vault")
        assert refused.returncode != 0 and "encryption key" in refused.stderr, refused.stderr
        assert "one" not in refused.stdout
        wrong = _cli(tmp_path, "read", "vault", "--encryption-key", other)
        assert wrong.returncode != 0 and "decryption failed" in wrong.stderr.lower(), wrong.stderr
        malformed = _cli(tmp_path, "read", "vault", "--encryption-key", "aegis-256:!!")
        assert malformed.returncode != 0 and "invalid base64" in malformed.stderr
    finally:
        if serve is not None:
            _, log = serve.stop_and_read_log()
            assert key.split(":")[1] not in log
