"""uvicorn's httptools protocol, bounded and a little leaner: a request head (request line and headers) has a size
limit, what the HTTP parser refuses gets an OpenAI-shaped answer like everything else the gateway says, a response's
head leaves in the same write as its body when both are ready, and the app hears of a lost connection without a
task of its own waiting for it."""
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.errors import GatewayError

REASONS = {400: b"Bad Request", 431: b"Request Header Fields Too Large"}


def protocol_with_limit(max_head_bytes: int) -> type:
    """The protocol class for `uvicorn.run(http=...)`, refusing request heads over `max_head_bytes`."""
    return type("GatewayHttpProtocol", (GatewayHttpProtocol,), {"max_head_bytes": max_head_bytes})


class HeadHoldingTransport:
    """The connection's transport, holding the first write after a request arrives (the response's head) until
    the end of the event loop's turn, so a body sent right after it goes out in the same system call."""

    __slots__ = ("_transport", "_loop", "_pending", "hold")

    def __init__(self, transport, loop):
        self._transport, self._loop = transport, loop
        self._pending: list[bytes] | None = None
        self.hold = False

    def write(self, data: bytes) -> None:
        if self._pending is not None:
            self._pending.append(data)
        elif self.hold:
            self.hold = False
            self._pending = [data]
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        pending, self._pending = self._pending, None
        if pending and not self._transport.is_closing():
            self._transport.write(b"".join(pending))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name):
        return getattr(self._transport, name)


class GatewayHttpProtocol(HttpToolsProtocol):
    """httptools keeps a header line in memory however long it grows; this counts the bytes of each request head
    as they arrive and answers 431 (then closes) once they pass the limit, before the head is complete.

    The app finds this protocol in `scope["extensions"]["tandem.connection"]`: `lost` says whether the client has
    gone, and `on_lost`, when set, is called when it goes."""

    max_head_bytes = 64 * 1024

    def connection_made(self, transport) -> None:
        super().connection_made(HeadHoldingTransport(transport, self.loop))
        self._head_bytes = 0  # None while a request's body is being read
        self._refused = False
        self.lost = False
        self.on_lost = None

    def connection_lost(self, exc) -> None:
        self.lost = True
        callback, self.on_lost = self.on_lost, None
        super().connection_lost(exc)
        if callback is not None:
            callback()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = {"tandem.connection": self}

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._head_bytes is not None:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._head_bytes is not None and self._head_bytes > self.max_head_bytes and not self._refused:
            self._refuse(431, f"The request's headers are larger than {self.max_head_bytes} bytes.",
                         "request_headers_too_large")

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        self.transport.hold = True
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head_bytes = 0

    def send_400_response(self, msg: str) -> None:
        self._refuse(400, "The request is not valid HTTP/1.1.", "invalid_http")

    def _refuse(self, status: int, message: str, code: str) -> None:
        self._refused = True
        body = GatewayError(status, message, code=code).body()
        self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                             b"connection: close\r\n\r\n%s" % (status, REASONS[status], len(body), body))
        self.transport.close()
