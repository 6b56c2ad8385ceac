"""A WAL writer process for the crash tests (run as a script, SIGKILLed by the test).

Usage: ``s3_crash_writer.py ENDPOINT BUCKET EPOCH RUN`` — starts node 1's S3 WAL at EPOCH,
recovers, then appends ``RUN-<n>`` records forever from 4 concurrent appenders, printing
``ACK <offset> <payload>`` after each acknowledgement and ``TRIM <offset>`` after each trim.
"""

from __future__ import annotations

import asyncio
import sys

from walstream.wal import WalMode
from walstream_wal_s3 import S3ObjectStore, S3Settings, S3Wal


async def main(endpoint_url: str, bucket: str, epoch: int, run: str) -> None:
    settings = S3Settings(bucket=bucket, endpoint_url=endpoint_url, region="us-east-1",
                          access_key_id="walstream-test", secret_access_key="walstream-test")
    wal = S3Wal(S3ObjectStore(settings), max_batch_interval_s=0.005, max_inflight=4)
    await wal.start(1, epoch, WalMode.READ_WRITE)
    recovered = [record.offset async for record in wal.recover()]
    print(f"RECOVERED {len(recovered)}", flush=True)
    if len(recovered) > 50:
        # Trim half of what survived, like an uploader that caught up.
        trim_to = recovered[len(recovered) // 2]
        await wal.trim(trim_to)
        print(f"TRIM {trim_to}", flush=True)
    counter = 0

    async def appender() -> None:
        nonlocal counter
        while True:
            counter += 1
            payload = f"{run}-{counter}"
            offset = await wal.append(payload.encode())
            print(f"ACK {offset} {payload}", flush=True)

    await asyncio.gather(*(appender() for _ in range(4)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))
