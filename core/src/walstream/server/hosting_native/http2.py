"""An HTTP/2 connection of the native listener (cleartext, prior knowledge: h2c): the ``h2``
library's state machine (frames, HPACK, stream states, flow control) driven by an
:class:`asyncio.Protocol` in the node's event loop, each stream served to the ASGI application by
its own task (:class:`~walstream.server.hosting_native.http2_stream.Http2Stream`).

A connection that opens with the client preface is handed here by the HTTP/1.1 side
(:mod:`walstream.server.hosting_native.http1`) with the bytes read so far. Its SETTINGS:
``MAX_CONCURRENT_STREAMS`` :data:`MAX_STREAMS`, 1 MiB stream and connection windows
(:data:`WINDOW_BYTES`; what a stream's application has not read holds the client back),
``MAX_FRAME_SIZE`` 1 MiB (a header block is still cut at 256 KiB), ``MAX_HEADER_LIST_SIZE`` 64
KiB (as the HTTP/1.1 head). What ``h2`` writes for one round of received bytes (answers to PING
and SETTINGS, WINDOW_UPDATE, RST_STREAM) and what the streams' answers produce during one turn
of the event loop goes out in one ``transport.write``.

Per request, ``h2``'s own work is most of the cost of HTTP/2 here: its HPACK coders are replaced
by cheaper ones (:mod:`~walstream.server.hosting_native.header_codec`), its validation of
request headers is off and done in one pass by
:mod:`~walstream.server.hosting_native.http2_request` (a malformed request gets RST_STREAM
``PROTOCOL_ERROR``, a header list over 64 KiB ``431`` in S2's error shape, ``CONNECT`` ``400``),
and one eager ``repr`` per received frame is skipped (:class:`_H2Connection`). A header list
over 256 KiB (the HPACK decoder's bound), or a header block growing past it, gets GOAWAY
``ENHANCE_YOUR_CALM``. A request body that disagrees with its ``content-length``, or any other
protocol error, is a connection error (GOAWAY with ``h2``'s code, then close). An application
that fails before its headers went out gets a ``500`` in S2's error shape; after, its stream is
reset (``INTERNAL_ERROR``). An answer complete before its request body is ends with RST_STREAM
``NO_ERROR`` (RFC 9113 8.1).

GOAWAY. ``h2`` accepts no frame at all once a GOAWAY was sent or received, and neither do the
clients built on it (S2's Python SDK): a GOAWAY is therefore only sent when no stream is in
progress. A graceful close (:meth:`Http2Connection.shutdown`) first sets
``MAX_CONCURRENT_STREAMS`` to 0 and refuses new streams (RST_STREAM ``REFUSED_STREAM``: the
client may retry them elsewhere), lets the streams in progress finish, then sends GOAWAY
``NO_ERROR`` and closes. A GOAWAY from the client ends the connection (its streams see
``http.disconnect``). Idle: a connection without a stream for ``header_timeout`` (since it
opened or since its last stream ended) gets GOAWAY and is closed, as an idle HTTP/1.1
keep-alive connection is; a PING does not keep it open.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import h2.config
import h2.connection
import h2.events
import h2.settings
from h2.errors import ErrorCodes
from h2.exceptions import (
    DenialOfServiceError,
    ProtocolError,
    StreamClosedError,
    StreamIDTooLowError,
)
from h2.frame_buffer import FrameBuffer
from hyperframe.frame import RstStreamFrame

from walstream.server.hosting_native.flow import WriteFlow
from walstream.server.hosting_native.framing import LINGER_S
from walstream.server.hosting_native.header_codec import CachingDecoder, LiteralEncoder
from walstream.server.hosting_native.http2_request import (
    MAX_HEADER_LIST_BYTES,
    Malformed,
    request_scope,
)
from walstream.server.hosting_native.http2_stream import Http2Stream
from walstream.server.s2.errors import S2Error

if TYPE_CHECKING:
    from walstream.server.hosting_native.listener import NativeListener

__all__ = ["MAX_HEADER_LIST_BYTES", "MAX_STREAMS", "WINDOW_BYTES", "Http2Connection"]

log = logging.getLogger("walstream.server.hosting_native")

#: Streams a client may have open at once on one connection.
MAX_STREAMS = 128
#: Flow-control windows the listener grants, per stream and per connection.
WINDOW_BYTES = 1 << 20
#: Largest frame the client may send: a stream window in one frame (a 100-record append of
#: 110 KB is one DATA frame, not seven: 33% less HTTP/2 work for it than at the default 16 KiB).
FRAME_BYTES = WINDOW_BYTES
#: Larger header lists, or header blocks (HEADERS and CONTINUATION frames) longer than this,
#: are not decoded at all: GOAWAY ENHANCE_YOUR_CALM.
_HPACK_BOUND_BYTES = 4 * MAX_HEADER_LIST_BYTES
_INITIAL_WINDOW = 65535  # RFC 9113 6.9.2
#: The client preface and the head of its first frame, which must be SETTINGS (not an ACK).
_OPENING_BYTES = 24 + 9
_SETTINGS_TYPE = 0x4

_CONFIG = h2.config.H2Configuration(
    client_side=False,
    header_encoding=None,
    validate_inbound_headers=False,  # checked here, once per request (see the docstring)
    normalize_inbound_headers=False,
    validate_outbound_headers=False,  # the streams send lower-case, checked headers
    normalize_outbound_headers=False,
)
_SETTINGS = {
    h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_STREAMS,
    h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW_BYTES,
    h2.settings.SettingCodes.MAX_FRAME_SIZE: FRAME_BYTES,
    h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST_BYTES,
}
_JSON = b"application/json"

DataReceived = h2.events.DataReceived
RequestReceived = h2.events.RequestReceived
StreamEnded = h2.events.StreamEnded
StreamReset = h2.events.StreamReset
WindowUpdated = h2.events.WindowUpdated
ConnectionTerminated = h2.events.ConnectionTerminated
RemoteSettingsChanged = h2.events.RemoteSettingsChanged


class _FrameBuffer(FrameBuffer):
    """``h2``'s frame reader, refusing a header block (HEADERS and its CONTINUATION frames)
    over :data:`_HPACK_BOUND_BYTES` as its frames arrive: h2 bounds only their number (64), so a
    block of 1 MiB frames would be held up to 64 MiB before the HPACK bound saw it."""

    def _update_header_buffer(self, frame: Any) -> Any:
        frame = super()._update_header_buffer(frame)
        pending = self._headers_buffer
        if pending and sum(len(part.data) for part in pending) > _HPACK_BOUND_BYTES:
            raise DenialOfServiceError("a header block over 256 KiB")
        return frame


class _H2Connection(h2.connection.H2Connection):
    """``h2``'s connection without the one eager cost of its logging: ``_receive_frame`` formats
    every received frame (``repr``) for a trace line its silent logger drops, 4% of the event
    loop's time under load. The same method as h2 4.x's otherwise (pinned below 5 in
    ``core/pyproject.toml``, as is :class:`_FrameBuffer`'s use of its reader's internals)."""

    def _receive_frame(self, frame: Any) -> list[h2.events.Event]:
        events: list[h2.events.Event]
        try:
            frames, events = self._frame_dispatch_table[frame.__class__](frame)
        except StreamClosedError as error:
            # Closed by RST_STREAM: answer RST_STREAM; else a connection error.
            if not self._stream_is_closed_by_reset(error.stream_id):
                raise
            reset = RstStreamFrame(error.stream_id)
            reset.error_code = error.error_code
            self._prepare_for_sending([reset])
            events = error._events
        except StreamIDTooLowError as error:
            # Closed by RST_STREAM: a stream error; by END_STREAM or implicitly: a connection
            # error.
            if self._stream_is_closed_by_reset(error.stream_id):
                reset = RstStreamFrame(error.stream_id)
                reset.error_code = ErrorCodes.STREAM_CLOSED
                self._prepare_for_sending([reset])
                events = []
            elif self._stream_is_closed_by_end(error.stream_id):
                raise StreamClosedError(error.stream_id) from error
            else:
                raise
        else:
            self._prepare_for_sending(frames)
        return events


class Http2Connection(WriteFlow):
    """One HTTP/2 connection (see the module's docstring)."""

    __slots__ = (
        "client",
        "closing",
        "counted",
        "draining",
        "flush_pending",
        "h2",
        "idle_deadline",
        "last_stream_id",
        "linger_handle",
        "listener",
        "opening",
        "server_address",
        "streams",
        "transport",
    )

    def __init__(
        self,
        listener: NativeListener,
        transport: asyncio.Transport,
        client: tuple[str, int] | None,
        server_address: tuple[str, int] | None,
    ) -> None:
        self.listener = listener
        self.loop = listener.loop
        self.transport = transport
        self.client = client
        self.server_address = server_address
        self.counted = False
        """Counted in the listener's open connections (until connection_lost)."""
        self.closed = False
        """The transport is gone."""
        self.closing = False
        """GOAWAY went out (or a protocol error): input is dropped, the connection closes."""
        self.draining = False
        """The listener is closing: new streams are refused, GOAWAY once the last one ends."""
        self.streams: dict[int, Http2Stream] = {}
        """Streams whose application is running."""
        self.last_stream_id = 0
        """The last stream taken (GOAWAY names it: later ones were refused, never processed)."""
        self.flush_pending = False
        self.writing_paused = False
        self.drain_waiters: list[asyncio.Future[None]] = []
        self.linger_handle: asyncio.TimerHandle | None = None
        self.opening: bytes | None = b""
        """Bytes received before the head of the first frame was complete (then None)."""
        self.idle_deadline = self.loop.time() + listener.limits.header_timeout_s
        connection = _H2Connection(_CONFIG)
        connection.local_settings = h2.settings.Settings(client=False, initial_values=_SETTINGS)
        connection.max_inbound_frame_size = FRAME_BYTES
        connection.incoming_buffer = _FrameBuffer(server=True)
        connection.encoder = LiteralEncoder()
        connection.decoder = CachingDecoder(_HPACK_BOUND_BYTES)
        connection.initiate_connection()
        connection.increment_flow_control_window(WINDOW_BYTES - _INITIAL_WINDOW)
        self.h2 = connection

    def start(self, received: bytes) -> None:
        """Begin with the bytes read so far (the client preface first): the server's SETTINGS
        go out at once."""
        self.flush()
        self.data_received(received)

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return  # lingering after GOAWAY: what the client still sends is dropped
        if self.opening is not None:
            # RFC 9113 3.4: the preface is followed by SETTINGS (h2 does not check it).
            data = self.opening + data
            if len(data) < _OPENING_BYTES:
                self.opening = data
                return
            self.opening = None
            if data[_OPENING_BYTES - 6] != _SETTINGS_TYPE or data[_OPENING_BYTES - 5] & 1:
                self.h2.close_connection(ErrorCodes.PROTOCOL_ERROR)
                self.fail("the client preface is not followed by SETTINGS")
                return
        try:
            events = self.h2.receive_data(data)
        except ProtocolError as error:
            self.fail(f"{type(error).__name__}: {error}")
            return
        streams = self.streams
        for event in events:
            if isinstance(event, DataReceived):
                stream = streams.get(event.stream_id)
                if stream is None or stream.gone:
                    if event.flow_controlled_length:
                        self.h2.acknowledge_received_data(
                            event.flow_controlled_length, event.stream_id
                        )
                    continue
                if event.data:
                    stream.chunks.append(event.data)
                stream.credit += event.flow_controlled_length
                if event.stream_ended is not None:
                    stream.complete = True
                if stream.waiters:
                    stream.wake()
            elif isinstance(event, RequestReceived):
                self.request_received(event)
            elif isinstance(event, StreamEnded):
                stream = streams.get(event.stream_id)
                if stream is not None and not stream.complete:
                    stream.complete = True
                    if stream.waiters:
                        stream.wake()
            elif isinstance(event, WindowUpdated):
                if event.stream_id:
                    stream = streams.get(event.stream_id)
                    if stream is not None and stream.window_waiter is not None:
                        stream.wake_writer()
                else:
                    self.wake_writers()
            elif isinstance(event, StreamReset):
                stream = streams.get(event.stream_id)
                if stream is not None:
                    stream.lose()
            elif isinstance(event, RemoteSettingsChanged):
                if h2.settings.SettingCodes.INITIAL_WINDOW_SIZE in event.changed_settings:
                    self.wake_writers()
            elif isinstance(event, ConnectionTerminated):
                # h2 takes no frame after a GOAWAY: the connection ends here.
                self.closing = True
                for stream in streams.values():
                    stream.lose()
                last = self.h2.data_to_send()
                if last:
                    self.transport.write(last)
                self.transport.close()
                return
            # PING and SETTINGS are acknowledged by h2; priorities and trailers are ignored.
        self.flush()

    def eof_received(self) -> bool | None:
        return None  # the client is done: close (streams in progress see http.disconnect)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.closing = True
        if self.counted:
            self.counted = False
            self.listener.open -= 1
        if self.linger_handle is not None:
            self.linger_handle.cancel()
            self.linger_handle = None
        for stream in self.streams.values():
            stream.lose()
        self.wake_drained()
        if not self.streams:
            self.listener.connection_closed(self)

    # -- writing -----------------------------------------------------------------------------

    def schedule_flush(self) -> None:
        """Write what ``h2`` has to send at the end of this turn of the event loop (the
        answers of all streams that finish in it go out in one write)."""
        if not self.flush_pending:
            self.flush_pending = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.flush_pending = False
        data = self.h2.data_to_send()
        if data and not self.closing:
            self.transport.write(data)

    def acknowledge(self, stream_id: int, size: int) -> None:
        """The application took ``size`` flow-controlled bytes of a stream: hand them back to
        the client's windows (``h2`` sends WINDOW_UPDATE once half a window was taken)."""
        if self.closing:
            return
        self.h2.acknowledge_received_data(size, stream_id)
        if not self.flush_pending:
            data = self.h2.data_to_send()
            if data:
                self.transport.write(data)

    def wake_writers(self) -> None:
        for stream in self.streams.values():
            if stream.window_waiter is not None:
                stream.wake_writer()

    def reset(self, stream: Http2Stream, code: ErrorCodes) -> None:
        """Reset ``stream`` (its answer cannot be completed, or is complete before its
        request); what its application sends afterwards is dropped."""
        stream.gone = True
        if self.closing:
            return
        try:
            self.h2.reset_stream(stream.stream_id, code)
        except ProtocolError:
            return  # closed meanwhile
        self.schedule_flush()

    # -- requests ----------------------------------------------------------------------------

    def request_received(self, event: h2.events.RequestReceived) -> None:
        stream_id = event.stream_id
        if self.draining:
            self.h2.reset_stream(stream_id, ErrorCodes.REFUSED_STREAM)
            return
        complete = event.stream_ended is not None
        self.last_stream_id = stream_id
        try:
            scope = request_scope(
                event.headers, self.listener.asgi_version, self.server_address, self.client
            )
        except Malformed as why:
            log.info("HTTP/2 stream %d: malformed request (%s); reset", stream_id, why)
            self.h2.reset_stream(stream_id, ErrorCodes.PROTOCOL_ERROR)
            return
        except S2Error as refusal:
            self.refuse(stream_id, refusal, complete)
            return
        stream = Http2Stream(self, stream_id, scope)
        stream.complete = complete
        self.streams[stream_id] = stream
        stream.task = self.loop.create_task(self.run(stream), name="walstream-http2-stream")

    def refuse(self, stream_id: int, error: S2Error, complete: bool) -> None:
        """Answer a request the application does not see, in S2's error shape."""
        body = error.encoded()
        h2_connection = self.h2
        head = [(b":status", b"%d" % error.status), (b"content-type", _JSON)]
        if len(body) > min(
            h2_connection.local_flow_control_window(stream_id),
            h2_connection.max_outbound_frame_size,
        ):
            h2_connection.send_headers(stream_id, head, end_stream=True)  # the client's window is
        else:  # too small for the body: the status says enough
            head.append((b"content-length", b"%d" % len(body)))
            h2_connection.send_headers(stream_id, head)
            h2_connection.send_data(stream_id, body, end_stream=True)
        if not complete:
            self.h2.reset_stream(stream_id, ErrorCodes.NO_ERROR)

    async def run(self, stream: Http2Stream) -> None:
        """A stream's task: the application on its request."""
        scope = stream.scope
        try:
            await self.listener.app(scope, stream.receive, stream.send)
        except Exception:
            log.exception("%s %s failed in the application", scope["method"], scope["path"])
            if stream.finished or stream.gone:
                pass  # answered already, or nobody to answer
            elif stream.started and stream.head is None:  # its headers went out
                self.reset(stream, ErrorCodes.INTERNAL_ERROR)
            else:
                await self.internal_error(stream)
        else:
            if not stream.finished:
                if stream.started and stream.head is None:
                    log.error(
                        "%s %s: the application returned before its answer was complete",
                        scope["method"],
                        scope["path"],
                    )
                    self.reset(stream, ErrorCodes.INTERNAL_ERROR)
                else:
                    log.error(
                        "%s %s: the application returned without answering",
                        scope["method"],
                        scope["path"],
                    )
                    if not stream.gone:
                        await self.internal_error(stream)
        finally:
            self.stream_done(stream)

    async def internal_error(self, stream: Http2Stream) -> None:
        body = b'{"code":"other","message":"internal error; the server log has the details"}'
        stream.started = False  # headers held but not sent are replaced
        stream.head = None
        stream.length_left = -1
        stream.start(500, [(b"content-type", _JSON), (b"content-length", b"%d" % len(body))])
        await stream.send({"type": "http.response.body", "body": body})

    def stream_done(self, stream: Http2Stream) -> None:
        """A stream's application returned: hand back the window of what it did not read, end
        a request that is still sending, and close the connection if it was waiting for this."""
        del self.streams[stream.stream_id]
        if self.closing:
            if self.closed and not self.streams:
                self.listener.connection_closed(self)
            return
        if stream.credit:
            self.h2.acknowledge_received_data(stream.credit, stream.stream_id)
            stream.credit = 0
        if not stream.complete and not stream.gone:
            # The answer is complete before the request (RFC 9113 8.1): stop the client.
            self.reset(stream, ErrorCodes.NO_ERROR)
        if not self.streams:
            if self.draining:
                self.goaway()
                return
            self.idle_deadline = self.loop.time() + self.listener.limits.header_timeout_s
        self.schedule_flush()

    # -- closing -----------------------------------------------------------------------------

    def fail(self, reason: str) -> None:
        """A connection error: ``h2`` queued its GOAWAY; write it and close."""
        log.info("HTTP/2 connection from %s: protocol error (%s); GOAWAY", self.client, reason)
        for stream in self.streams.values():
            stream.lose()
        self.linger(self.h2.data_to_send())

    def goaway(self) -> None:
        """No stream is in progress: GOAWAY ``NO_ERROR``, then close."""
        if self.closing:
            return
        self.h2.close_connection(last_stream_id=self.last_stream_id)
        self.linger(self.h2.data_to_send())

    def linger(self, last: bytes) -> None:
        """Write ``last``, then close: the write side at once, the connection once the client
        closed its side too or ``LINGER_S`` passed (a reset would destroy what the client has
        not read yet)."""
        self.closing = True
        if self.closed:
            return
        transport = self.transport
        if last:
            transport.write(last)
        if not transport.can_write_eof():
            transport.close()
            return
        try:
            transport.write_eof()
        except OSError:  # the client is gone already
            transport.close()
            return
        self.linger_handle = self.loop.call_later(LINGER_S, transport.close)

    def check_head_deadline(self, now: float) -> None:
        """Close the connection when it had no stream for ``header_timeout``."""
        if not self.streams and not self.closing and self.idle_deadline <= now:
            self.goaway()

    def shutdown(self) -> None:
        """The listener is closing: GOAWAY now when idle, else refuse new streams and send it
        once the streams in progress ended (see the module's docstring)."""
        self.draining = True
        if self.closing:
            return
        if not self.streams:
            self.goaway()
            return
        self.h2.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 0})
        self.flush()

    def abort(self) -> None:
        """Shutdown's grace ran out: cancel the streams in progress and drop the connection."""
        self.closing = True
        for stream in list(self.streams.values()):
            if stream.task is not None and not stream.task.done():
                stream.task.cancel()
        if not self.closed:
            self.transport.abort()
