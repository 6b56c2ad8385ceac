"""A lean S2 REST client for the cluster tests and benchmarks (aiohttp, HTTP/1.1, JSON).

It speaks exactly what the tests need — create a basin and a stream, append with
``match_seq_num``, read, check the tail — against any node's base URL, and classifies every
answer the way a history checker needs it:

- ``ok``: the server acknowledged (append: ``start``/``end`` seq nums; read: bodies and tail);
- ``mismatch``: a ``412 seq_num_mismatch`` — the append was refused and the answer names the tail;
- ``failed``: the request certainly did not reach a server (connection refused), so it had no
  effect;
- ``ambiguous``: anything else (a timeout, a dropped connection, a 5xx, a 4xx other than 412):
  the append may or may not have happened.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp

__all__ = ["Answer", "S2Http"]

Status = Literal["ok", "mismatch", "failed", "ambiguous"]


@dataclass(frozen=True)
class Answer:
    """One classified answer (see the module docstring)."""

    status: Status
    start: int = 0
    end: int = 0
    tail: int | None = None
    bodies: tuple[str, ...] = ()
    detail: str = ""


class S2Http:
    """Requests to any node of a cluster, each bounded by ``timeout_s``."""

    def __init__(self, token: str, basin: str, *, timeout_s: float = 5.0) -> None:
        self.basin = basin
        self.timeout_s = timeout_s
        self._headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> S2Http:
        self._session = aiohttp.ClientSession(
            headers=self._headers, connector=aiohttp.TCPConnector(limit=0, force_close=False)
        )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def _call(
        self, method: str, url: str, body: Any = None, *, basin: bool = True
    ) -> tuple[int, Any] | Answer:
        """(status, JSON document) or a ``failed``/``ambiguous`` Answer when there is none."""
        assert self._session is not None, "use S2Http as an async context manager"
        headers = {"s2-basin": self.basin} if basin else {}
        data = None if body is None else json.dumps(body).encode()
        try:
            async with self._session.request(
                method,
                url,
                data=data,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            ) as response:
                raw = await response.read()
                try:
                    document = json.loads(raw) if raw else None
                except ValueError:
                    document = raw.decode(errors="replace")
                return response.status, document
        except aiohttp.ClientConnectorError as error:
            return Answer("failed", detail=f"connect: {error}")
        except (TimeoutError, aiohttp.ClientError, OSError) as error:
            return Answer("ambiguous", detail=f"{type(error).__name__}: {error}")

    async def ensure_basin(self, url: str) -> None:
        """Create the basin (409: it exists); raises on any other answer."""
        answer = await self._call("POST", f"{url}/v1/basins", {"basin": self.basin}, basin=False)
        _expect_created(answer, "basin", self.basin)

    async def ensure_stream(self, url: str, stream: str) -> None:
        answer = await self._call("POST", f"{url}/v1/streams", {"stream": stream})
        _expect_created(answer, "stream", stream)

    async def append(
        self, url: str, stream: str, bodies: list[str], match_seq_num: int | None
    ) -> Answer:
        """Append ``bodies`` as one batch, conditional on the tail when ``match_seq_num`` is set."""
        document: dict[str, Any] = {"records": [{"body": body} for body in bodies]}
        if match_seq_num is not None:
            document["match_seq_num"] = match_seq_num
        answer = await self._call("POST", f"{url}/v1/streams/{stream}/records", document)
        if isinstance(answer, Answer):
            return answer
        status, body = answer
        if status == 200 and isinstance(body, dict):
            return Answer("ok", body["start"]["seq_num"], body["end"]["seq_num"])
        if status == 412 and isinstance(body, dict) and "seq_num_mismatch" in body:
            return Answer("mismatch", tail=int(body["seq_num_mismatch"]))
        return Answer("ambiguous", detail=f"HTTP {status}: {body}")

    async def append_retrying(
        self, url: str, stream: str, body: str, seq_num: int, *, give_up_s: float = 30.0
    ) -> Answer:
        """Append one record at ``seq_num`` (``match_seq_num``), retrying what is ambiguous or
        failed until it is acknowledged, or until a ``412`` shows that the tail moved: then the
        record at ``seq_num`` decides (``ok`` when it is ``body``: an earlier attempt landed).
        Returns the last answer after ``give_up_s``."""
        deadline = asyncio.get_running_loop().time() + give_up_s
        while True:
            answer = await self.append(url, stream, [body], seq_num)
            if answer.status == "ok":
                return answer
            if answer.status == "mismatch":
                landed = await self.read(url, stream, seq_num, 1)
                if landed.status == "ok" and landed.bodies[:1] == (body,):
                    return Answer("ok", seq_num, seq_num + 1, detail="an earlier attempt landed")
                if landed.status == "ok":
                    return answer
            if asyncio.get_running_loop().time() > deadline:
                return answer
            await asyncio.sleep(0.05)

    async def read(self, url: str, stream: str, seq_num: int, count: int = 1000) -> Answer:
        """Up to ``count`` records from ``seq_num``; ``ok`` with bodies and tail (a start at or
        past the tail is ``ok`` with no bodies and the tail of the 416)."""
        answer = await self._call(
            "GET", f"{url}/v1/streams/{stream}/records?seq_num={seq_num}&count={count}"
        )
        if isinstance(answer, Answer):
            return answer
        status, body = answer
        if status == 200 and isinstance(body, dict):
            tail = body.get("tail")
            return Answer(
                "ok",
                tail=None if tail is None else int(tail["seq_num"]),
                bodies=tuple(str(record["body"]) for record in body["records"]),
            )
        if status == 416 and isinstance(body, dict) and "tail" in body:
            return Answer("ok", tail=int(body["tail"]["seq_num"]))
        return Answer("ambiguous", detail=f"HTTP {status}: {body}")

    async def check_tail(self, url: str, stream: str) -> Answer:
        answer = await self._call("GET", f"{url}/v1/streams/{stream}/records/tail")
        if isinstance(answer, Answer):
            return answer
        status, body = answer
        if status == 200 and isinstance(body, dict):
            return Answer("ok", tail=int(body["tail"]["seq_num"]))
        return Answer("ambiguous", detail=f"HTTP {status}: {body}")

    async def read_all(self, url: str, stream: str) -> list[str]:
        """Every record of ``stream`` from seq num 0, in order; raises if a page fails."""
        bodies: list[str] = []
        while True:
            answer = await self.read(url, stream, len(bodies))
            if answer.status != "ok":
                raise RuntimeError(f"reading {stream} from {url} failed: {answer.detail}")
            bodies.extend(answer.bodies)
            if not answer.bodies or (answer.tail is not None and len(bodies) >= answer.tail):
                return bodies


def _expect_created(answer: tuple[int, Any] | Answer, kind: str, name: str) -> None:
    if isinstance(answer, Answer):
        raise RuntimeError(f"creating {kind} {name!r} failed: {answer.detail}")
    status, body = answer
    if status not in (200, 201, 409):
        raise RuntimeError(f"creating {kind} {name!r} failed: HTTP {status} {body}")
