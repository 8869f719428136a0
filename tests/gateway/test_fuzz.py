"""Hypothesis against a running gateway (a real process, the mock upstream behind it): whatever the body or the
headers, the answer is a 200 or an OpenAI-shaped 4xx, it comes within seconds, and the process stays small.

Requests go over a raw socket, so bytes no HTTP library would send (invalid UTF-8, duplicate keys, numbers past
64 bits, nesting past any parser's limit, oversized headers) reach the gateway as written. Derandomized with a
bounded example count: the same cases run in CI every time.
"""
import json
import socket
from urllib.parse import urlsplit

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FUZZ = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
ANSWER_WITHIN_S = 10

leaves = (st.none() | st.booleans() | st.integers(min_value=-(2 ** 80), max_value=2 ** 80)
          | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12))
values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=16)
FIELDS = ["model", "messages", "prompt", "input", "stream", "stream_options", "max_tokens", "max_completion_tokens",
          "n", "stop", "temperature", "logprobs", "tools", "user"]
MESSAGES = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]),
                                           "content": st.text(max_size=30) | values}), min_size=1, max_size=3)


@st.composite
def shaped(draw) -> bytes:
    """An object over the OpenAI fields, each value plausible or not, usually for the model that exists."""
    body = draw(st.fixed_dictionaries({}, optional={name: values for name in FIELDS}))
    if draw(st.booleans()):
        body["model"] = "m"
    if draw(st.booleans()):
        body["messages"] = draw(MESSAGES)
    if draw(st.booleans()):
        body["stream"] = draw(st.booleans())
    for name in ("max_tokens", "n"):
        if draw(st.booleans()):
            body[name] = draw(st.integers(min_value=-(2 ** 70), max_value=2 ** 70))
    return json.dumps(body).encode()


def _object(pairs: list[tuple[str, bytes]]) -> bytes:
    return b"{" + b",".join(json.dumps(k).encode() + b":" + v for k, v in pairs) + b"}"


@st.composite
def duplicate_keys(draw) -> bytes:
    first, second = draw(values), draw(values)
    name = draw(st.sampled_from(["model", "stream", "max_tokens", "messages", "stream_options"]))
    return _object([("model", b'"m"'), ("messages", b'[{"role":"user","content":"hi"}]'),
                    (name, json.dumps(first).encode()), (name, json.dumps(second).encode())])


@st.composite
def huge_numbers(draw) -> bytes:
    digits = draw(st.integers(min_value=1, max_value=5000))
    number = draw(st.sampled_from([b"9" * digits, b"-" + b"9" * digits, b"1e" + str(digits).encode(),
                                   b"0." + b"0" * digits + b"1", b"1" * digits + b".5e-" + str(digits).encode()]))
    name = draw(st.sampled_from(["max_tokens", "n", "temperature", "max_completion_tokens"]))
    return _object([("model", b'"m"'), ("messages", b'[{"role":"user","content":"hi"}]'), (name, number)])


@st.composite
def deep(draw) -> bytes:
    # around the limits of the JSON libraries on the way (orjson reads 1,024 levels but writes only 255)
    depth = draw(st.sampled_from([254, 255, 256, 512, 1023, 1024, 1025]) | st.integers(min_value=2, max_value=100_000))
    opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]))
    return _object([("model", b'"m"'), ("messages", b'[{"role":"user","content":"hi"}]'),
                    ("stream", draw(st.sampled_from([b"true", b"false"]))),
                    ("extra", opener * depth + b"1" + closer * depth)])


@st.composite
def bad_utf8(draw) -> bytes:
    junk = draw(st.binary(min_size=1, max_size=64))
    where = draw(st.sampled_from(["content", "model", "key", "raw"]))
    if where == "raw":
        return junk
    if where == "key":
        return b'{"model":"m","' + junk + b'":1,"messages":[{"role":"user","content":"hi"}]}'
    if where == "model":
        return b'{"model":"' + junk + b'","messages":[{"role":"user","content":"hi"}]}'
    return b'{"model":"m","messages":[{"role":"user","content":"' + junk + b'"}]}'


bodies = shaped() | duplicate_keys() | huge_numbers() | deep() | bad_utf8() | st.binary(max_size=256)
header_value = st.binary(max_size=200).map(lambda b: bytes(c for c in b if c not in b"\r\n\0").strip())


def exchange(base_url: str, head: bytes, body: bytes) -> tuple[int, dict, bytes]:
    """Send raw bytes, read until the server closes: (status, headers, body). Fails the test on a hang."""
    sock = socket.create_connection(("127.0.0.1", urlsplit(base_url).port), timeout=ANSWER_WITHIN_S)
    data = b""
    try:
        try:
            sock.sendall(head + body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused while sending (an oversized head): the answer is still there to read
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
        except TimeoutError:
            pytest.fail(f"no complete answer within {ANSWER_WITHIN_S}s; got {data[:200]!r}")
    finally:
        sock.close()
    head_end = data.find(b"\r\n\r\n")
    assert head_end > 0, f"not an HTTP answer: {data[:200]!r}"
    lines = data[:head_end].split(b"\r\n")
    status = int(lines[0].split(b" ")[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
    payload = data[head_end + 4:]
    if headers.get(b"transfer-encoding") == b"chunked":
        payload = _dechunk(payload)
    return status, headers, payload


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size, _, rest = data.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out, data = out + rest[:n], rest[n + 2:]
    return out


def assert_200_or_openai_4xx(status: int, headers: dict, payload: bytes) -> None:
    assert status == 200 or 400 <= status < 500, (status, payload[:300])
    if status != 200:
        assert headers.get(b"content-type") == b"application/json", headers
        error = orjson.loads(payload)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]


def request_head(path: bytes, raw_key: str, length: int, extra: list[tuple[bytes, bytes]] = ()) -> bytes:
    lines = [b"POST " + path + b" HTTP/1.1", b"Host: gateway", b"Connection: close",
             b"Content-Type: application/json", b"Authorization: Bearer " + raw_key.encode(),
             b"Content-Length: " + str(length).encode(), *(name + b": " + value for name, value in extra)]
    return b"\r\n".join(lines) + b"\r\n\r\n"


@pytest.fixture
def fuzz_target(world):
    world.deployment("m", max_model_len=4096)
    _, raw = world.key()
    return raw


def test_any_body_gets_a_200_or_an_openai_shaped_4xx(gateway, fuzz_target):
    before = gateway.rss_kib()

    @FUZZ
    @given(body=bodies, path=st.sampled_from([b"/v1/chat/completions", b"/v1/completions", b"/v1/embeddings"]))
    def check(body, path):
        assert_200_or_openai_4xx(*exchange(gateway.base_url, request_head(path, fuzz_target, len(body)), body))

    check()
    assert (gateway.rss_kib() - before) / 1024 < 64


def test_any_headers_get_a_200_or_an_openai_shaped_4xx(gateway, fuzz_target):
    names = st.sampled_from([b"X-Request-ID", b"Authorization", b"Content-Type", b"Accept", b"X-Filler",
                             b"X-Forwarded-For", b"Cookie"])
    oversized = st.integers(min_value=1, max_value=300).map(lambda kib: [(b"X-Big", b"a" * (kib * 1024))])
    many = st.integers(min_value=1, max_value=2000).map(lambda n: [(b"X-H%d" % i, b"v") for i in range(n)])
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'

    @FUZZ
    @given(extra=st.lists(st.tuples(names, header_value), max_size=6) | oversized | many,
           key=st.sampled_from(["real", "none", "junk"]), junk=header_value)
    def check(extra, key, junk):
        raw = {"real": fuzz_target, "none": "", "junk": junk.decode("latin-1")}[key]
        assert_200_or_openai_4xx(*exchange(gateway.base_url, request_head(b"/v1/chat/completions", raw, len(body),
                                                                          extra), body))

    check()
