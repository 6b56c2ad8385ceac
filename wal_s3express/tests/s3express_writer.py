"""A WAL writer run as a separate process by the crash tests (SIGKILLed by them).

    python s3express_writer.py OPTIONS_JSON EPOCH SEED

Appends records ``b"<epoch>:<index>:<padding>"`` with up to 32 in flight and prints one line
``ACK <offset> <epoch>:<index>`` per acknowledgement, in order, flushed at once.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections import deque

from walstream.config import BuildContext
from walstream.wal import WalMode
from walstream_wal_s3express import S3EXPRESS_WAL


async def main(options: dict[str, object], epoch: int, seed: int) -> None:
    rng = random.Random(seed)
    wal = S3EXPRESS_WAL.build(options, BuildContext(node_id=1), "wal")
    await wal.start(1, epoch, WalMode.READ_WRITE)
    async for _ in wal.recover():
        pass
    print("READY", flush=True)
    in_flight: deque[tuple[str, asyncio.Future[int]]] = deque()
    index = 0
    while True:
        while len(in_flight) < 32:
            name = f"{epoch}:{index}"
            data = f"{name}:".encode() + b"p" * rng.randrange(0, 2000)
            in_flight.append((name, asyncio.ensure_future(wal.append(data))))
            index += 1
        name, future = in_flight.popleft()
        offset = await future
        sys.stdout.write(f"ACK {offset} {name}\n")
        sys.stdout.flush()
        if rng.random() < 0.05:
            await asyncio.sleep(rng.random() * 0.01)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
