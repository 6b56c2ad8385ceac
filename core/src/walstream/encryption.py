"""Records encrypted with a client's key: AEGIS-256 or AES-256-GCM, a fresh random nonce per
record, sealed before the records reach the WAL and object storage and opened on read with the
same key. walstream never stores the key (nor logs it): whoever reads an encrypted stream brings
the key, through the Python API (``encryption=``), the CLI (``--encryption-key`` or
``WALSTREAM_ENCRYPTION_KEY``), Spark (option ``encryptionKey``) or S2's ``s2-encryption-key``
header.

**The stored record** (the format is documented for independent decryption in
``docs/architecture/encryption.md``): an encrypted record keeps its timestamp in the clear and
has exactly one header, :data:`ENCRYPTED_HEADER`, whose value is the cipher's name; no key; its
value is the *envelope*::

    format_id (1 byte) | nonce | ciphertext | tag (16 bytes)

    format_id 0x01: AEGIS-256 v1,   nonce 32 bytes (libsodium crypto_aead_aegis256)
    format_id 0x02: AES-256-GCM v1, nonce 12 bytes

The associated data is ``b"walstream-record-v1" + stream_id`` (8 bytes big-endian), so an
envelope cannot be moved to another stream unnoticed. The plaintext is the record's key,
headers and value::

    flags (1 byte: bit 0 = a key follows)
    [key length (u32) | key]
    header count (u16)
    header count x (name length (u16) | name (UTF-8) | value length (u32) | value)
    value (the rest)

(all integers big-endian). This is the layout of S2's encrypted records (``format_id``, nonce,
ciphertext, tag; S2 binds its own stream id the same way), with walstream's record inside.

**Rules.** A read without a key of an encrypted record raises :class:`EncryptionKeyRequired`; a
read with a key of a record that is not encrypted with it (another key, another cipher, a
plaintext record, a changed byte) raises :class:`DecryptionFailed`. A plaintext append may not
use the header name :data:`ENCRYPTED_HEADER` (it is reserved). AES-256-GCM's 12-byte random
nonces collide with probability about ``n**2 / 2**97`` after ``n`` records under one key: keep
it below 2**32 records per key (S2's limit for this cipher too) or use AEGIS-256, whose 32-byte
nonces have no practical bound.
"""

from __future__ import annotations

import base64
import binascii
import enum
import os
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from nacl import bindings as sodium
from nacl.exceptions import CryptoError

from walstream.errors import DecryptionFailed, EncryptionKeyRequired, InvalidArgument
from walstream.records import ENCRYPTED_HEADER, Record, SequencedRecord

__all__ = [
    "ENCRYPTED_HEADER",
    "KEY_BYTES",
    "Cipher",
    "EncryptionKey",
    "associated_data",
    "decrypt_record",
    "encrypt_record",
    "is_encrypted",
    "open_records",
]

KEY_BYTES = 32
"""Both ciphers take a 256-bit key."""
TAG_BYTES = 16
_AAD_PREFIX = b"walstream-record-v1"


class Cipher(enum.Enum):
    """The ciphers, by S2's names."""

    AEGIS_256 = "aegis-256"
    AES_256_GCM = "aes-256-gcm"

    @property
    def format_id(self) -> int:
        return 0x01 if self is Cipher.AEGIS_256 else 0x02

    @property
    def nonce_bytes(self) -> int:
        return 32 if self is Cipher.AEGIS_256 else 12

    @classmethod
    def named(cls, name: str) -> Cipher:
        """The cipher named ``name`` (``aegis-256`` or ``aes-256-gcm``, any case)."""
        try:
            return cls(name.strip().lower())
        except ValueError:
            raise InvalidArgument(
                f"cipher {name[:40]!r}: one of {', '.join(c.value for c in cls)}"
            ) from None


_BY_FORMAT = {cipher.format_id: cipher for cipher in Cipher}


@dataclass(frozen=True, eq=False)
class EncryptionKey:
    """A client's key for one cipher. Its bytes never appear in ``repr`` or ``str``."""

    cipher: Cipher
    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.cipher, Cipher):
            raise InvalidArgument("cipher: a walstream.encryption.Cipher")
        if not isinstance(self.secret, bytes) or len(self.secret) != KEY_BYTES:
            size = len(self.secret) if isinstance(self.secret, (bytes, bytearray)) else None
            raise InvalidArgument(
                f"an {self.cipher.value} key has {KEY_BYTES} bytes, got {size}"
                if size is not None
                else f"an {self.cipher.value} key is {KEY_BYTES} bytes"
            )

    def __repr__(self) -> str:
        return f"EncryptionKey({self.cipher.value}, <{KEY_BYTES} bytes hidden>)"

    __str__ = __repr__

    @classmethod
    def from_base64(cls, cipher: Cipher | str, text: str) -> EncryptionKey:
        """A key given as standard base64 of its 32 bytes (as S2's ``s2-encryption-key``)."""
        chosen = cipher if isinstance(cipher, Cipher) else Cipher.named(cipher)
        try:
            secret = base64.b64decode(text.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise EncryptionKeyRequired(
                f"invalid encryption key for stream cipher '{chosen.value}': invalid base64"
            ) from None
        if len(secret) != KEY_BYTES:
            raise EncryptionKeyRequired(
                f"invalid encryption key length for stream cipher '{chosen.value}': "
                f"{len(secret)}"
            )
        return cls(chosen, secret)

    @classmethod
    def parse(cls, text: str) -> EncryptionKey:
        """A key written ``CIPHER:BASE64`` (the CLI's ``--encryption-key``, Spark's option)."""
        cipher, colon, encoded = text.partition(":")
        if not colon:
            raise InvalidArgument(
                "an encryption key is written CIPHER:BASE64, e.g. aegis-256:<44 base64 "
                "characters of 32 bytes>"
            )
        return cls.from_base64(cipher, encoded)


def associated_data(stream_id: int) -> bytes:
    """What each envelope of stream ``stream_id`` is bound to."""
    return _AAD_PREFIX + struct.pack(">q", stream_id)


def is_encrypted(record: Record | SequencedRecord) -> bool:
    headers = record.headers
    return bool(headers) and headers[0][0] == ENCRYPTED_HEADER


def _plaintext(key: bytes | None, headers: Sequence[tuple[str, bytes]], value: bytes) -> bytes:
    parts = [b"\x01" + struct.pack(">I", len(key)) + key if key is not None else b"\x00"]
    parts.append(struct.pack(">H", len(headers)))
    for name, header_value in headers:
        encoded = name.encode("utf-8")
        parts.append(struct.pack(">H", len(encoded)) + encoded)
        parts.append(struct.pack(">I", len(header_value)) + header_value)
    parts.append(value)
    return b"".join(parts)


def _parse_plaintext(data: bytes) -> tuple[bytes | None, tuple[tuple[str, bytes], ...], bytes]:
    position = 1
    key: bytes | None = None
    if data[0] & 1:
        (size,) = struct.unpack_from(">I", data, position)
        position += 4
        key = data[position : position + size]
        position += size
    (count,) = struct.unpack_from(">H", data, position)
    position += 2
    headers: list[tuple[str, bytes]] = []
    for _ in range(count):
        (name_size,) = struct.unpack_from(">H", data, position)
        position += 2
        name = data[position : position + name_size].decode("utf-8")
        position += name_size
        (value_size,) = struct.unpack_from(">I", data, position)
        position += 4
        headers.append((name, data[position : position + value_size]))
        position += value_size
    if position > len(data) or (key is not None and len(key) != size):
        raise ValueError("truncated")
    return key, tuple(headers), data[position:]


def _seal(encryption: EncryptionKey, nonce: bytes, plaintext: bytes, aad: bytes) -> bytes:
    if encryption.cipher is Cipher.AEGIS_256:
        sealed: bytes = sodium.crypto_aead_aegis256_encrypt(
            plaintext, aad, nonce, encryption.secret
        )
        return sealed
    return AESGCM(encryption.secret).encrypt(nonce, plaintext, aad)


def _unseal(cipher: Cipher, secret: bytes, nonce: bytes, sealed: bytes, aad: bytes) -> bytes:
    if cipher is Cipher.AEGIS_256:
        opened: bytes = sodium.crypto_aead_aegis256_decrypt(sealed, aad, nonce, secret)
        return opened
    return AESGCM(secret).decrypt(nonce, sealed, aad)


def encrypt_record(record: Record, encryption: EncryptionKey, stream_id: int) -> Record:
    """``record`` sealed for stream ``stream_id`` with a fresh random nonce (the operating
    system's CSPRNG: a nonce must never repeat, so it is not the engine's seeded generator)."""
    cipher = encryption.cipher
    nonce = os.urandom(cipher.nonce_bytes)
    plaintext = _plaintext(record.key, record.headers, record.value)
    sealed = _seal(encryption, nonce, plaintext, associated_data(stream_id))
    envelope = bytes([cipher.format_id]) + nonce + sealed
    return Record(
        envelope, None, ((ENCRYPTED_HEADER, cipher.value.encode()),), record.timestamp_ms
    )


def decrypt_record(
    record: SequencedRecord, encryption: EncryptionKey, stream_id: int
) -> SequencedRecord:
    """``record`` opened with ``encryption`` (:class:`DecryptionFailed` when it cannot be)."""
    where = f"record {record.offset} of stream {stream_id}"
    if not is_encrypted(record):
        raise DecryptionFailed(
            f"{where} is not encrypted, but was read with an {encryption.cipher.value} key: "
            "read it without a key"
        )
    envelope = record.value
    cipher = _BY_FORMAT.get(envelope[0]) if envelope else None
    if cipher is not encryption.cipher:
        found = "an unknown format" if cipher is None else cipher.value
        raise DecryptionFailed(
            f"{where} is encrypted with {found}, not {encryption.cipher.value}: read it with "
            "the key it was written with"
        )
    nonce_end = 1 + cipher.nonce_bytes
    if len(envelope) < nonce_end + TAG_BYTES:
        raise DecryptionFailed(f"{where}: malformed encrypted record (too short)")
    try:
        plaintext = _unseal(
            cipher,
            encryption.secret,
            envelope[1:nonce_end],
            envelope[nonce_end:],
            associated_data(stream_id),
        )
        key, headers, value = _parse_plaintext(plaintext)
    except (InvalidTag, CryptoError):
        raise DecryptionFailed(
            f"record decryption failed: {where} was not written with this key (or was "
            "changed): read it with the key it was written with"
        ) from None
    except (ValueError, struct.error, IndexError):
        raise DecryptionFailed(f"{where}: malformed decrypted record") from None
    return SequencedRecord(record.offset, value, key, headers, record.timestamp_ms)


def open_records(
    records: Iterable[SequencedRecord], encryption: EncryptionKey | None, stream_id: int
) -> list[SequencedRecord]:
    """The records as their writer appended them: decrypted with ``encryption``; without a key
    they are returned as they are, unless one is encrypted (:class:`EncryptionKeyRequired`)."""
    if encryption is None:
        listed = records if isinstance(records, list) else list(records)
        for record in listed:
            if is_encrypted(record):
                cipher = record.headers[0][1].decode("latin-1")[:20]
                raise EncryptionKeyRequired(
                    f"missing encryption key for stream cipher '{cipher}': record "
                    f"{record.offset} of stream {stream_id} is encrypted; read it with its key "
                    "(Python: encryption=EncryptionKey(...); CLI: --encryption-key or "
                    "WALSTREAM_ENCRYPTION_KEY; Spark: option encryptionKey; S2: the "
                    "s2-encryption-key header)"
                )
        return listed
    return [decrypt_record(record, encryption, stream_id) for record in records]
