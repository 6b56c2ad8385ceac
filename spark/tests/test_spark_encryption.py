"""Spark reads a stream written with a client key: with option ``encryptionKey`` it gets the
records as appended, without it (or with another key) the query fails naming the problem."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import pytest
import walstream.blocking
from walstream import Cipher, EncryptionKey, Record

pytestmark = pytest.mark.slow


def _key_text(key: EncryptionKey) -> str:
    return f"{key.cipher.value}:{base64.b64encode(key.secret).decode()}"


def test_spark_reads_an_encrypted_stream_with_its_key_and_fails_without(
    spark: Any, deployment: Path
) -> None:
    key = EncryptionKey(Cipher.AES_256_GCM, os.urandom(32))
    with walstream.blocking.open(str(deployment)) as client:
        stream = client.create_stream("vault")
        for start in range(0, 3000, 500):
            stream.append(
                [
                    Record(b"secret-%d" % i, key=b"k", headers=(("h", b"%d" % i),))
                    for i in range(start, start + 500)
                ],
                encryption=key,
            )

    def load(**options: str) -> Any:
        reader = spark.read.format("walstream").option("config", str(deployment))
        reader = reader.option("streams", "vault")
        for name, value in options.items():
            reader = reader.option(name, value)
        return reader.load()

    rows = load(encryptionKey=_key_text(key)).orderBy("offset").collect()
    assert [bytes(row["value"]) for row in rows] == [b"secret-%d" % i for i in range(3000)]
    assert {bytes(row["key"]) for row in rows} == {b"k"}
    assert bytes(rows[7]["headers"]["h"]) == b"7"

    with pytest.raises(Exception, match="EncryptionKeyRequired"):
        load().collect()
    other = EncryptionKey(Cipher.AES_256_GCM, os.urandom(32))
    with pytest.raises(Exception, match="DecryptionFailed"):
        load(encryptionKey=_key_text(other)).collect()
    with pytest.raises(Exception, match="invalid base64"):
        load(encryptionKey="aes-256-gcm:!!").collect()
