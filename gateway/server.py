"""uvicorn's httptools protocol, bounded: a request head (request line and headers) has a size limit, and what the
HTTP parser refuses gets an OpenAI-shaped answer like everything else the gateway says."""
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.errors import GatewayError

REASONS = {400: b"Bad Request", 431: b"Request Header Fields Too Large"}


def protocol_with_limit(max_head_bytes: int) -> type:
    """The protocol class for `uvicorn.run(http=...)`, refusing request heads over `max_head_bytes`."""
    return type("GatewayHttpProtocol", (GatewayHttpProtocol,), {"max_head_bytes": max_head_bytes})


class GatewayHttpProtocol(HttpToolsProtocol):
    """httptools keeps a header line in memory however long it grows; this counts the bytes of each request head
    as they arrive and answers 431 (then closes) once they pass the limit, before the head is complete."""

    max_head_bytes = 64 * 1024

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._head_bytes = 0  # None while a request's body is being read
        self._refused = False

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
