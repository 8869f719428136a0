"""A small OpenAI-compatible upstream on loopback for the conformance tests, which breaks one rule on request.

`faults` names the rule to break (see FAULTS); text is a deterministic function of the prompt, so temperature 0
repeats itself and stop strings can be tested. It can also serve Prometheus text at /metrics, one body per GET.
"""
import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "tiny-llama"
WORDS = ("tide", "gull", "salt", "wave", "brine", "foam", "reef", "kelp", "spray", "drift", "swell", "cove")
FAULTS = {
    "models_missing": "models_list",
    "bad_usage_total": "chat_nonstream",
    "content_type": "stream_content_type",
    "framing": "stream_data_framing",
    "done_missing": "stream_done_last",
    "unstable_id": "stream_stable_ids",
    "no_role": "stream_first_delta_role",
    "finish_twice": "stream_finish_reason_once",
    "ignore_max_tokens": "max_tokens_length",
    "ignore_stop": "stop_strings",
    "usage_in_choices": "include_usage",
    "pd_double_usage": "include_usage",
    "n_index": "n_choices",
    "error_detail": "error_bad_param",
    "unknown_model_detail": "error_unknown_model",
}


def _words(prompt: str, n: int, seed: int) -> list[str]:
    digest = hashlib.sha256(f"{prompt}|{seed}".encode()).digest()
    return [WORDS[digest[i % len(digest)] % len(WORDS)] + ("," if i % 5 == 4 else "") for i in range(n)]


class MockUpstream:
    def __init__(self, faults=(), metrics_bodies=()):
        self.faults = set(faults)
        self.metrics_bodies = list(metrics_bodies)
        self.seen_keys: list[str] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/metrics"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        mock = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _json(self, status, body, ctype="application/json"):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _error(self, status, message, etype, param=None):
                if (status == 400 and "error_detail" in mock.faults) or \
                        (status == 404 and "unknown_model_detail" in mock.faults):
                    return self._json(status, {"detail": message})
                return self._json(status, {"error": {"message": message, "type": etype, "param": param,
                                                     "code": None}})

            def do_GET(self):
                mock.seen_keys.append(self.headers.get("Authorization", ""))
                if self.path == "/metrics":
                    body = mock.metrics_bodies.pop(0) if len(mock.metrics_bodies) > 1 else \
                        (mock.metrics_bodies[0] if mock.metrics_bodies else "")
                    data = body.encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if self.path == "/v1/models":
                    ids = [] if "models_missing" in mock.faults else [MODEL]
                    return self._json(200, {"object": "list", "data": [
                        {"id": i, "object": "model", "created": 0, "owned_by": "tandem"} for i in ids]})
                self._json(404, {"error": {"message": "no such route", "type": "not_found", "param": None,
                                           "code": None}})

            def do_POST(self):
                mock.seen_keys.append(self.headers.get("Authorization", ""))
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                chat = self.path == "/v1/chat/completions"
                if self.path not in ("/v1/chat/completions", "/v1/completions"):
                    return self._error(404, "no such route", "not_found")
                if body.get("model") != MODEL:
                    return self._error(404, f"The model {body.get('model')!r} does not exist.", "NotFoundError",
                                       "model")
                max_tokens = body.get("max_tokens", 16)
                if not isinstance(max_tokens, int) or max_tokens < 1:
                    return self._error(400, "max_tokens must be at least 1.", "BadRequestError", "max_tokens")
                n = body.get("n", 1)
                prompt = json.dumps(body["messages"]) if chat else body.get("prompt", "")
                prompt_tokens = len(prompt.split()) + (3 if chat else 0)
                budget = 24 if "ignore_max_tokens" in mock.faults else max_tokens
                seed = 0 if not body.get("temperature") else body.get("seed", 1)
                choices = []
                for i in range(n):
                    words = _words(prompt, budget, seed + i)
                    text, reason = " " + " ".join(words), "length"
                    stops = [] if "ignore_stop" in mock.faults else (body.get("stop") or [])
                    for s in stops:
                        if s in text:
                            text, reason = text[: text.index(s)], "stop"
                    if "ignore_max_tokens" in mock.faults:
                        reason = "stop"
                    index = 0 if "n_index" in mock.faults else i
                    choices.append((index, text, reason, len(text.split())))
                completion = sum(c[3] for c in choices)
                usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                         "total_tokens": prompt_tokens + completion + (1 if "bad_usage_total" in mock.faults else 0)}
                rid = f"{'chatcmpl' if chat else 'cmpl'}-{hashlib.md5(prompt.encode()).hexdigest()[:12]}"
                created = int(time.time())
                if not body.get("stream"):
                    out = []
                    for index, text, reason, _ in choices:
                        c = {"index": index, "finish_reason": reason, "logprobs": None}
                        c.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
                        out.append(c)
                    return self._json(200, {"id": rid, "object": "chat.completion" if chat else "text_completion",
                                            "created": created, "model": MODEL, "choices": out, "usage": usage})
                self._stream(chat, rid, created, choices, usage, body)

            def _stream(self, chat, rid, created, choices, usage, body):
                obj = "chat.completion.chunk" if chat else "text_completion"
                ctype = "text/plain" if "content_type" in mock.faults else "text/event-stream; charset=utf-8"
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                seq = [0]

                def send(chunk):
                    seq[0] += 1
                    chunk = {"id": rid + ("x" if "unstable_id" in mock.faults and seq[0] == 3 else ""),
                             "object": obj, "created": created, "model": MODEL, **chunk}
                    prefix = "data:" if "framing" in mock.faults and seq[0] == 2 else "data: "
                    self.wfile.write(f"{prefix}{json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()

                def choice(index, piece=None, reason=None, role=False):
                    if chat:
                        delta = {"content": piece} if piece is not None else {}
                        if role and "no_role" not in mock.faults:
                            delta = {"role": "assistant", **delta}
                        return {"index": index, "delta": delta, "finish_reason": reason, "logprobs": None}
                    return {"index": index, "text": piece or "", "finish_reason": reason, "logprobs": None}

                for index, text, reason, _ in choices:
                    pieces = [p for p in text.split(" ") if p]
                    send({"choices": [choice(index, "" if chat else None, role=True)]})
                    for p in pieces:
                        send({"choices": [choice(index, " " + p)]})
                    send({"choices": [choice(index, None, reason)]})
                    if "finish_twice" in mock.faults:
                        send({"choices": [choice(index, None, reason)]})
                if (body.get("stream_options") or {}).get("include_usage"):
                    last = [choice(0, None, None)] if "usage_in_choices" in mock.faults else []
                    if "pd_double_usage" in mock.faults:  # prefill and decode both counted the prompt
                        p = usage["prompt_tokens"] * 2
                        usage = {**usage, "prompt_tokens": p, "total_tokens": p + usage["completion_tokens"]}
                    send({"choices": last, "usage": usage})
                if "done_missing" not in mock.faults:
                    self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        return Handler
