"""An HTTP/2 connection of the listener (h2c with prior knowledge, or HTTP/2 chosen by ALPN over
TLS): the ``h2`` library's state machine (frames, HPACK, stream states, flow control) driven by an
:class:`asyncio.Protocol` in the node's event loop, each stream served to the ASGI application by
its own task (:class:`~walstream.server.http.http2_stream.Http2Stream`). ``h2`` is used through
its public interface only (no private method is overridden); its HPACK coders are swapped for
cheaper ones through its ``encoder``/``decoder`` attributes
(:mod:`~walstream.server.http.header_codec`), and its header validation is off and done in one
pass by :mod:`~walstream.server.http.http2_request`.

A connection that opens with the client preface is handed here by the HTTP/1.1 side
(:mod:`walstream.server.http.http1`) with the bytes read so far. Its SETTINGS:
``MAX_CONCURRENT_STREAMS`` :data:`MAX_STREAMS`, 1 MiB stream and connection windows
(:data:`WINDOW_BYTES`: what a stream's application has not read holds the client back),
``MAX_FRAME_SIZE`` 1 MiB (a large append is one DATA frame), ``MAX_HEADER_LIST_SIZE`` 64 KiB (as
the HTTP/1.1 head); a header block (HEADERS and its CONTINUATION frames) is refused as soon as it
passes 256 KiB, as its frames arrive (:mod:`~walstream.server.http.frame_guard`), before ``h2``
would hold it.

What a hostile client cannot do (``docs/architecture/http.md``):

- **Rapid reset.** A stream the client resets is cancelled (its work stops) and counts against
  :data:`MAX_STREAMS` until its task ended. Streams reset by the client, or by the server for the
  client's fault (malformed, refused), spend a budget per connection
  (``server.max_resets_per_connection``) and per remote address
  (``server.max_resets_per_address``), refilled over 10 s; past either, GOAWAY
  ``ENHANCE_YOUR_CALM`` and the connection closes (and new connections of an address whose
  budget is spent are refused).
- **PING, SETTINGS, PRIORITY and empty-DATA floods** spend ``server.max_control_frames`` per
  10 s; past it, GOAWAY ``ENHANCE_YOUR_CALM``.
- **Not reading.** While the socket's write buffer is over its high-water mark nothing more is
  read, so no PING or SETTINGS is answered into a buffer that does not drain; an answer that makes
  no progress for ``server.send_timeout`` resets its stream.
- **HPACK and CONTINUATION bombs.** A header list is decoded up to 256 KiB at most (the HPACK
  decoder's bound), a header block is bounded as above; either past its bound is a connection
  error (GOAWAY; ``ENHANCE_YOUR_CALM`` for the block).

A malformed request gets RST_STREAM ``PROTOCOL_ERROR``, a header list over 64 KiB ``431`` in S2's
error shape, ``CONNECT`` ``400``. A request body that disagrees with its ``content-length``, or any
other protocol error, is a connection error (GOAWAY with ``h2``'s code, then close). An
application that fails before its headers went out gets a ``500`` in S2's error shape; after, its
stream is reset (``INTERNAL_ERROR``). An answer complete before its request body is ends with
RST_STREAM ``NO_ERROR`` (RFC 9113 8.1).

GOAWAY. ``h2`` accepts no frame at all once a GOAWAY was sent or received, and neither do the
clients built on it (S2's Python SDK): a graceful GOAWAY is therefore only sent when no stream is
in progress. A graceful close (:meth:`Http2Connection.shutdown`) first sets
``MAX_CONCURRENT_STREAMS`` to 0 and refuses new streams (RST_STREAM ``REFUSED_STREAM``: the
client may retry them elsewhere), lets the streams in progress finish, then sends GOAWAY
``NO_ERROR`` and closes. A GOAWAY from the client ends the connection (its streams see
``http.disconnect``). Idle: a connection without a stream for ``header_timeout`` (since it
opened or since its last stream ended) gets GOAWAY and is closed, as an idle HTTP/1.1
keep-alive connection is; a PING does not keep it open. When the server is full, the
longest-idle connection (HTTP/1.1 or HTTP/2) is closed for a new one.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import h2.config
import h2.connection
import h2.events
import h2.settings
from h2.errors import ErrorCodes
from h2.exceptions import ProtocolError
from h2.frame_buffer import FrameBuffer

from walstream.server.http.flow import WriteFlow
from walstream.server.http.frame_guard import HeaderBlockGuard
from walstream.server.http.framing import LINGER_S, PREFACE
from walstream.server.http.header_codec import CachingDecoder, LiteralEncoder
from walstream.server.http.http2_request import (
    MAX_HEADER_LIST_BYTES,
    Malformed,
    request_scope,
)
from walstream.server.http.http2_stream import Http2Stream
from walstream.server.http.request_body import OUTPUT_ROOM
from walstream.server.http.state import OutputBudget, TokenBucket
from walstream.server.s2.errors import S2Error

if TYPE_CHECKING:
    from walstream.server.http.state import ServingState

__all__ = ["MAX_HEADER_LIST_BYTES", "MAX_STREAMS", "WINDOW_BYTES", "Http2Connection"]

log = logging.getLogger("walstream.server.http")

#: Streams a client may have open at once on one connection (and streams whose application is
#: still running, reset or not: a reset stream counts until its task ended).
MAX_STREAMS = 128
#: Flow-control windows the listener grants, per stream and per connection.
WINDOW_BYTES = 1 << 20
#: Largest frame the client may send: a stream window in one frame (a 100-record append of
#: 110 KB is one DATA frame, not seven: less HTTP/2 work per append than at the default 16 KiB).
FRAME_BYTES = WINDOW_BYTES
#: Larger header lists, or header blocks (HEADERS and CONTINUATION frames) longer than this,
#: are not decoded at all: GOAWAY ENHANCE_YOUR_CALM (:mod:`~walstream.server.http.frame_guard`).
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
#: Frames a client may send without asking for any work, counted by server.max_control_frames.
_CONTROL_EVENTS = (h2.events.PingReceived, RemoteSettingsChanged, h2.events.PriorityUpdated)


class Http2Connection(WriteFlow):
    """One HTTP/2 connection (see the module's docstring)."""

    __slots__ = (
        "client",
        "closing",
        "control_budget",
        "counted",
        "draining",
        "flush_pending",
        "guard",
        "h2",
        "host",
        "idle_deadline",
        "last_stream_id",
        "linger_handle",
        "listener",
        "opening",
        "output",
        "read_paused",
        "reset_budget",
        "server_address",
        "streams",
        "transport",
    )

    def __init__(
        self,
        listener: ServingState,
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
        self.host = ""
        """The remote address, counted in the listener's per-address table while counted."""
        now = self.loop.time()
        self.reset_budget = TokenBucket(listener.limits.max_resets_per_connection, now)
        self.control_budget = TokenBucket(listener.limits.max_control_frames, now)
        self.output = OutputBudget(listener.limits.max_connection_output_bytes)
        self.read_paused = False
        """Reading is paused while the socket's write buffer is over its high-water mark."""
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
        self.guard = HeaderBlockGuard(_HPACK_BOUND_BYTES)
        connection = h2.connection.H2Connection(_CONFIG)
        connection.local_settings = h2.settings.Settings(client=False, initial_values=_SETTINGS)
        connection.max_inbound_frame_size = FRAME_BYTES
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
            framed = self.guard.feed(data[len(PREFACE) :])
        else:
            framed = self.guard.feed(data)
        if not framed:
            self.calm("it sent a header block over 256 KiB")
            return
        try:
            events = self.h2.receive_data(data)
        except ProtocolError as error:
            self.fail(f"{type(error).__name__}: {error}")
            return
        streams = self.streams
        for event in events:
            if isinstance(event, DataReceived):
                if not event.flow_controlled_length and event.stream_ended is None:
                    if not self.spend_control():  # an empty DATA frame asks for nothing
                        return
                    continue
                stream = streams.get(event.stream_id)
                if stream is None or stream.gone:
                    if event.flow_controlled_length:
                        try:
                            self.h2.acknowledge_received_data(
                                event.flow_controlled_length, event.stream_id
                            )
                        except ProtocolError:  # the stream closed meanwhile
                            pass
                    continue
                if event.data:
                    stream.chunks.append(event.data)
                stream.credit += event.flow_controlled_length
                if event.stream_ended is not None:
                    stream.complete = True
                if stream.waiters:
                    stream.wake()
            elif isinstance(event, RequestReceived):
                if not self.request_received(event):
                    return
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
                # (remote_reset False: h2 reset it for the client's fault, a frame on a closed
                # stream: it counts as well.)
                stream = streams.get(event.stream_id)
                if stream is not None:
                    stream.cancel()  # its work stops; it counts until its task ended
                if not self.spend_reset():
                    return
            elif isinstance(event, _CONTROL_EVENTS):
                if not self.spend_control():
                    return
                if isinstance(event, RemoteSettingsChanged):
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

    # -- budgets -------------------------------------------------------------------------------

    def spend_reset(self) -> bool:
        """One stream reset by the client (or for its fault): False when the connection's or
        the address's budget is spent (GOAWAY ENHANCE_YOUR_CALM went out)."""
        now = self.loop.time()
        if not self.reset_budget.take(now):
            self.calm("its server.max_resets_per_connection budget is spent")
            return False
        if self.host:
            address = self.listener.addresses.get(self.host)
            if address is not None and not address.resets.take(now):
                self.calm("its address's server.max_resets_per_address budget is spent")
                return False
        return True

    def spend_control(self) -> bool:
        """One PING, SETTINGS, PRIORITY or empty DATA frame: False past the budget."""
        if not self.control_budget.take(self.loop.time()):
            self.calm("its server.max_control_frames budget is spent")
            return False
        return True

    def calm(self, why: str) -> None:
        """A budget is spent (or a bound passed): GOAWAY ENHANCE_YOUR_CALM, cancel every
        stream, close."""
        log.info("HTTP/2 connection from %s: %s; GOAWAY ENHANCE_YOUR_CALM", self.client, why)
        for stream in list(self.streams.values()):
            stream.cancel()
        try:
            self.h2.close_connection(
                ErrorCodes.ENHANCE_YOUR_CALM, last_stream_id=self.last_stream_id
            )
        except ProtocolError:
            pass
        self.linger(self.h2.data_to_send())
        self.release_buffers()  # what the client still sends is dropped

    # -- write-side backpressure ---------------------------------------------------------------

    def pause_writing(self) -> None:
        """The socket's buffer is over its high-water mark: read nothing more (no PING or
        SETTINGS is answered into a buffer that does not drain) until it is below again."""
        self.writing_paused = True
        if not self.read_paused and not self.closed:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self.read_paused and not self.closed:
            self.read_paused = False
            self.transport.resume_reading()
        self.wake_drained()

    def eof_received(self) -> bool | None:
        return None  # the client is done: close (streams in progress see http.disconnect)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.closing = True
        if self.counted:
            self.counted = False
            listener = self.listener
            listener.open -= 1
            listener.mark_busy(self)
            if self.host:
                address = listener.addresses.get(self.host)
                if address is not None:
                    address.connections -= 1
                    listener.forget_address(self.host)
        if self.linger_handle is not None:
            self.linger_handle.cancel()
            self.linger_handle = None
        for stream in self.streams.values():
            stream.lose()  # http.disconnect: long polls and sessions end, an append finishes
        self.output.wake_all()  # reads waiting for output room see they are gone
        self.release_buffers()
        self.wake_drained()
        if not self.streams:
            self.listener.connection_closed(self)

    def release_buffers(self) -> None:
        """Drop what ``h2`` buffers for this connection (received frames, a header block being
        assembled, bytes not yet written). ``h2``'s connection object is a reference cycle of
        its own (its frame dispatch table holds its bound methods), freed only by the cyclic
        collector, which ``walstream serve`` runs seldom (:func:`walstream.tuning.tune_gc`):
        without this, a closed connection's buffers (up to a header block of about 1 MiB) would
        stay in memory until the next full collection."""
        self.h2.incoming_buffer = FrameBuffer(server=True)
        self.h2.data_to_send()

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

    def request_received(self, event: h2.events.RequestReceived) -> bool:
        """Start the application on a new stream (or refuse it); False when the connection
        closed (a budget is spent)."""
        stream_id = event.stream_id
        if self.draining:
            self.h2.reset_stream(stream_id, ErrorCodes.REFUSED_STREAM)
            return True
        complete = event.stream_ended is not None
        self.last_stream_id = stream_id
        if len(self.streams) >= MAX_STREAMS:
            # Streams reset by the client whose tasks have not ended yet still count.
            self.h2.reset_stream(stream_id, ErrorCodes.REFUSED_STREAM)
            return self.spend_reset()
        try:
            scope = request_scope(
                event.headers, self.listener.asgi_version, self.server_address, self.client
            )
        except Malformed as why:
            log.info("HTTP/2 stream %d: malformed request (%s); reset", stream_id, why)
            self.h2.reset_stream(stream_id, ErrorCodes.PROTOCOL_ERROR)
            return self.spend_reset()
        except S2Error as refusal:
            self.refuse(stream_id, refusal, complete)
            return True
        stream = Http2Stream(self, stream_id, scope)
        scope["extensions"] = {OUTPUT_ROOM: stream.output_room}
        stream.complete = complete
        if not self.streams:
            self.listener.mark_busy(self)
        self.streams[stream_id] = stream
        stream.task = self.loop.create_task(self.run(stream), name="walstream-http2-stream")
        return True

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
        """A stream's task: the application on its request (a task cancelled before it began
        is finished by :meth:`Http2Stream.cancel`'s callback instead)."""
        try:
            await self.serve_stream(stream)
        finally:
            self.stream_done(stream)

    async def serve_stream(self, stream: Http2Stream) -> None:
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
        stream.settle_all()
        stream.scope.pop("extensions", None)  # (it holds the stream: a reference cycle)
        if self.streams.pop(stream.stream_id, None) is None:
            return
        if self.closing:
            if self.closed and not self.streams:
                self.listener.connection_closed(self)
            return
        if stream.credit:
            try:
                self.h2.acknowledge_received_data(stream.credit, stream.stream_id)
            except ProtocolError:  # reset meanwhile
                pass
            stream.credit = 0
        if not stream.complete and not stream.gone:
            # The answer is complete before the request (RFC 9113 8.1): stop the client.
            self.reset(stream, ErrorCodes.NO_ERROR)
        if not self.streams:
            if self.draining:
                self.goaway()
                return
            self.idle_deadline = self.loop.time() + self.listener.limits.header_timeout_s
            if self.counted:
                self.listener.mark_idle(self)
        self.schedule_flush()

    # -- closing -----------------------------------------------------------------------------

    def fail(self, reason: str) -> None:
        """A connection error: ``h2`` queued its GOAWAY; write it and close."""
        log.info("HTTP/2 connection from %s: protocol error (%s); GOAWAY", self.client, reason)
        for stream in self.streams.values():
            stream.lose()
        self.linger(self.h2.data_to_send())
        self.release_buffers()  # what the client still sends is dropped

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

    def evict(self) -> None:
        """The server is full and this connection has no stream: GOAWAY and close."""
        if not self.streams:
            self.goaway()

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
