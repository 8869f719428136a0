"""A TCP pass-through that a test can cut and restore, to take PostgreSQL or Redis away from a real gateway.

With `postgres=True` it also counts the queries the client sends (PostgreSQL's Execute and simple Query
messages, read off the wire), which is how the tests see whether the gateway touched its database. It answers
an SSL or GSS encryption request with "no" itself, so the rest of the conversation is readable.
"""
import asyncio
import socket
import struct
import threading

SSL_REQUEST, GSS_REQUEST = 80877103, 80877104


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, *, postgres: bool = False):
        self.target = (target_host, target_port)
        self.postgres = postgres
        self.queries = 0
        self.port = _free_port()
        self._loop = asyncio.new_event_loop()
        self._server = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.restore()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cut(self) -> None:
        """Refuse new connections and drop every open one, as an unreachable server would."""
        self._call(self._cut())

    def restore(self) -> None:
        self._call(self._listen())

    def close(self) -> None:
        self.cut()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _listen(self):
        if self._server is None:
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)

    async def _cut(self):
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        upstream = self._client_to_server(reader, writer, up_writer) if self.postgres else _pump(reader, up_writer)
        tasks = [asyncio.ensure_future(upstream), asyncio.ensure_future(_pump(up_reader, writer))]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)  # either side gone: both go
        for task in tasks:
            task.cancel()
        for w in (writer, up_writer):
            self._writers.discard(w)
            w.transport.abort()

    async def _client_to_server(self, reader, writer, up_writer):
        # Untyped messages first (length, code): encryption requests, answered here, then the startup message.
        while True:
            head = await reader.readexactly(8)
            length, code = struct.unpack("!II", head)
            rest = await reader.readexactly(length - 8)
            if code in (SSL_REQUEST, GSS_REQUEST):
                writer.write(b"N")
                continue
            up_writer.write(head + rest)
            break
        while True:  # typed messages: one byte of type, then the length (which counts itself)
            head = await reader.readexactly(5)
            body = await reader.readexactly(struct.unpack("!I", head[1:])[0] - 4)
            if head[:1] in (b"E", b"Q"):
                self.queries += 1
            up_writer.write(head + body)


async def _pump(reader, writer):
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
