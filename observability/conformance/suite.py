"""The conformance suite: what clients that only change `base_url` and `api_key` rely on, checked with the
official `openai` client and, for the wire framing the client hides, raw httpx."""
import json
from dataclasses import dataclass, field

import httpx
import openai

PROMPT = "Write one sentence about the sea and the wind."
MESSAGES = [{"role": "user", "content": PROMPT}]


@dataclass
class CheckResult:
    name: str
    passed: bool
    evidence: str


@dataclass
class StreamCapture:
    """One streamed response as seen on the wire."""

    label: str
    status: int = 0
    content_type: str = ""
    lines: list[str] = field(default_factory=list)
    events: list = field(default_factory=list)  # parsed JSON chunks, or the string "[DONE]"
    problems: list[str] = field(default_factory=list)  # framing faults found while reading


def _short(value, limit: int = 400) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + "…"


def stream_capture(http: httpx.Client, path: str, body: dict, label: str) -> StreamCapture:
    """POST with stream=True and record every line; each event must be `data: <json>` then a blank line."""
    cap = StreamCapture(label)
    with http.stream("POST", path, json=body) as r:
        cap.status, cap.content_type = r.status_code, r.headers.get("content-type", "")
        if r.status_code != 200:
            r.read()
            cap.problems.append(f"HTTP {r.status_code}: {_short(r.text)}")
            return cap
        cap.lines = list(r.iter_lines())
    expect_blank = False
    for i, line in enumerate(cap.lines):
        if expect_blank:
            if line != "":
                cap.problems.append(f"line {i}: expected a blank line after an event, got {_short(line, 80)!r}")
            expect_blank = False
            continue
        if line == "":
            continue
        if not line.startswith("data: "):
            cap.problems.append(f"line {i}: not `data: ` framed: {_short(line, 80)!r}")
            continue
        payload = line[len("data: "):]
        expect_blank = True
        if payload == "[DONE]":
            cap.events.append("[DONE]")
            continue
        try:
            cap.events.append(json.loads(payload))
        except ValueError:
            cap.problems.append(f"line {i}: data is not JSON: {_short(payload, 80)!r}")
    return cap


def _chunks(cap: StreamCapture) -> list[dict]:
    return [e for e in cap.events if isinstance(e, dict)]


def check_content_type(caps) -> CheckResult:
    bad = [f"{c.label}: {c.content_type or '(none)'}" for c in caps if not c.content_type.startswith("text/event-stream")]
    return CheckResult("stream_content_type", not bad, "; ".join(bad) or
                       "; ".join(f"{c.label}: {c.content_type}" for c in caps))


def check_framing(caps) -> CheckResult:
    bad = [f"{c.label}: {p}" for c in caps for p in c.problems]
    return CheckResult("stream_data_framing", not bad, "; ".join(bad[:6]) or
                       f"every line of {len(caps)} streams is `data: ` framed JSON with blank-line separators")


def check_done_last(caps) -> CheckResult:
    bad = []
    for c in caps:
        done = [i for i, e in enumerate(c.events) if e == "[DONE]"]
        if done != [len(c.events) - 1]:
            bad.append(f"{c.label}: [DONE] at {done or 'nowhere'} of {len(c.events)} events")
    return CheckResult("stream_done_last", not bad, "; ".join(bad) or "[DONE] once, last, in every stream")


def check_stable_ids(caps) -> CheckResult:
    bad = []
    for c in caps:
        for key in ("id", "created", "model"):
            seen = {json.dumps(ch.get(key)) for ch in _chunks(c)}
            if len(seen) != 1:
                bad.append(f"{c.label}: {key} took {len(seen)} values {sorted(seen)[:3]}")
    return CheckResult("stream_stable_ids", not bad, "; ".join(bad) or "id, created and model constant per stream")


def check_first_delta_role(caps) -> CheckResult:
    bad, seen = [], []
    for c in caps:
        if not c.label.startswith("chat"):
            continue
        first: dict[int, dict] = {}
        for ch in _chunks(c):
            for choice in ch.get("choices") or []:
                first.setdefault(choice.get("index"), choice.get("delta") or {})
        for index, delta in first.items():
            seen.append(f"{c.label}[{index}] role={delta.get('role')!r}")
            if delta.get("role") != "assistant":
                bad.append(f"{c.label}: choice {index}'s first delta is {_short(delta, 120)}")
    return CheckResult("stream_first_delta_role", bool(seen) and not bad, "; ".join(bad or seen) or "no chat chunks")


def check_finish_once(caps) -> CheckResult:
    bad, seen = [], []
    for c in caps:
        finishes: dict[int, list] = {}
        for ch in _chunks(c):
            for choice in ch.get("choices") or []:
                finishes.setdefault(choice.get("index"), [])
                if choice.get("finish_reason") is not None:
                    finishes[choice.get("index")].append(choice["finish_reason"])
        for index, reasons in sorted(finishes.items(), key=lambda kv: str(kv[0])):
            seen.append(f"{c.label}[{index}]={reasons}")
            if len(reasons) != 1:
                bad.append(f"{c.label}: choice {index} finish_reason {reasons}")
    return CheckResult("stream_finish_reason_once", bool(seen) and not bad, "; ".join(bad or seen))


def _usage_ok(usage) -> str | None:
    if usage is None:
        return "no usage"
    if usage.total_tokens != usage.prompt_tokens + usage.completion_tokens:
        return f"total {usage.total_tokens} ≠ prompt {usage.prompt_tokens} + completion {usage.completion_tokens}"
    return None


def _nonstream(client: openai.OpenAI, model: str):
    """Chat and completions without streaming; also returns the chat usage for the streamed comparison."""
    out = []
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=12, temperature=0)
    problems = []
    if chat.object != "chat.completion" or len(chat.choices) != 1:
        problems.append(f"object {chat.object!r}, {len(chat.choices)} choices")
    else:
        ch = chat.choices[0]
        if ch.message.role != "assistant" or not isinstance(ch.message.content, str):
            problems.append(f"message {ch.message.role!r} {type(ch.message.content).__name__}")
        if ch.finish_reason not in ("stop", "length"):
            problems.append(f"finish_reason {ch.finish_reason!r}")
    if p := _usage_ok(chat.usage):
        problems.append(p)
    out.append(CheckResult("chat_nonstream", not problems, "; ".join(problems) or
                           f"id {chat.id}, finish {chat.choices[0].finish_reason}, usage {chat.usage.model_dump()}"))
    comp = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0)
    problems = []
    if comp.object != "text_completion" or len(comp.choices) != 1 or not isinstance(comp.choices[0].text, str):
        problems.append(f"object {comp.object!r}, {len(comp.choices)} choices")
    elif comp.choices[0].finish_reason not in ("stop", "length"):
        problems.append(f"finish_reason {comp.choices[0].finish_reason!r}")
    if p := _usage_ok(comp.usage):
        problems.append(p)
    out.append(CheckResult("completions_nonstream", not problems, "; ".join(problems) or
                           f"id {comp.id}, finish {comp.choices[0].finish_reason}, usage {comp.usage.model_dump()}"))
    return out, chat.usage


def _max_tokens(client: openai.OpenAI, model: str) -> CheckResult:
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0)
    reason, n = r.choices[0].finish_reason, r.usage.completion_tokens if r.usage else None
    return CheckResult("max_tokens_length", reason == "length" and n == 4,
                       f"max_tokens=4 → finish_reason {reason!r}, completion_tokens {n}")


def _stop(client: openai.OpenAI, http: httpx.Client, model: str) -> CheckResult:
    """Take a piece of what the model says unprompted, then ask again with that piece as a stop string."""
    base = client.completions.create(model=model, prompt=PROMPT, max_tokens=24, temperature=0).choices[0].text
    core = base.strip()
    stop = core[len(core) // 2: len(core) // 2 + 3].strip()
    if len(stop) < 2:
        return CheckResult("stop_strings", False, f"could not pick a stop string from {base!r}")
    problems = []
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop])
    if stop in r.choices[0].text:
        problems.append(f"completions output {r.choices[0].text!r} contains stop {stop!r}")
    cap = stream_capture(http, "/completions", {"model": model, "prompt": PROMPT, "max_tokens": 24,
                                                "temperature": 0, "stop": [stop], "stream": True}, "completions+stop")
    streamed = "".join(c["choices"][0].get("text") or "" for c in _chunks(cap) if c.get("choices"))
    if stop in streamed:
        problems.append(f"streamed output {streamed!r} contains stop {stop!r}")
    return CheckResult("stop_strings", not problems, "; ".join(problems) or
                       f"stop {stop!r} (taken from {base!r}) absent; finish {r.choices[0].finish_reason!r}")


def _include_usage(caps: list[StreamCapture], nonstream_usage) -> CheckResult:
    """The stream that asked for usage ends with one usage chunk; streams that did not ask carry none."""
    *plain, cap = caps
    chunks = _chunks(cap)
    with_usage = [i for i, c in enumerate(chunks) if c.get("usage")]
    problems = [f"{c.label}: usage sent without stream_options.include_usage" for c in plain
                if any(ch.get("usage") for ch in _chunks(c))]
    if len(with_usage) != 1:
        problems.append(f"{len(with_usage)} chunks carry usage")
    else:
        i = with_usage[0]
        last = chunks[i]
        u = last["usage"]
        if i != len(chunks) - 1:
            problems.append("the usage chunk is not the last chunk before [DONE]")
        if last.get("choices") != []:
            problems.append(f"usage chunk choices = {_short(last.get('choices'), 120)}")
        if u.get("total_tokens") != u.get("prompt_tokens", 0) + u.get("completion_tokens", 0):
            problems.append(f"usage totals do not add up: {u}")
        if nonstream_usage and u.get("prompt_tokens") != nonstream_usage.prompt_tokens:
            problems.append(f"prompt_tokens {u.get('prompt_tokens')} streamed vs {nonstream_usage.prompt_tokens} "
                            "non-streamed for the same prompt (counted twice across prefill and decode?)")
    return CheckResult("include_usage", not problems, "; ".join(problems) or f"one final usage chunk {chunks[-1]['usage']}")


def _n_choices(client: openai.OpenAI, cap: StreamCapture, model: str) -> CheckResult:
    r = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, n=2, temperature=0.8, seed=7)
    indexes = sorted(c.index for c in r.choices)
    streamed = sorted({ch["index"] for c in _chunks(cap) for ch in c.get("choices") or []})
    ok = indexes == [0, 1] and streamed == [0, 1]
    return CheckResult("n_choices", ok, f"n=2 non-stream indexes {indexes}, stream indexes {streamed}")


def _error_shape(r: httpx.Response, want_status: int, name: str, what: str) -> CheckResult:
    try:
        body = r.json()
    except ValueError:
        body = None
    err = body.get("error") if isinstance(body, dict) else None
    ok = (r.status_code == want_status and isinstance(err, dict) and isinstance(err.get("message"), str)
          and isinstance(err.get("type"), str) and "param" in err and "code" in err)
    return CheckResult(name, ok, f"{what} → HTTP {r.status_code} {_short(body if body is not None else r.text, 300)}")


def conformance_run(*, base_url: str, api_key: str, model: str, timeout: float = 60.0) -> list[CheckResult]:
    """Run every check against an OpenAI-compatible base URL (ending in /v1); a check that raises fails with the
    exception as its evidence."""
    base_url = base_url.rstrip("/")
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout)
    http = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {api_key}"}, timeout=timeout)
    results: list[CheckResult] = []

    def guarded(names: list[str], fn):
        try:
            out = fn()
        except Exception as e:  # noqa: BLE001 (an endpoint's failure is this check's evidence, not a crash)
            results.extend(CheckResult(n, False, f"{type(e).__name__}: {_short(str(e))}") for n in names)
            return None
        results.extend(out if isinstance(out, list) else [out])
        return out

    try:
        def models():
            ids = [m.id for m in client.models.list().data]
            return CheckResult("models_list", model in ids, f"/v1/models lists {ids[:20]}")

        guarded(["models_list"], models)
        usage_box = {}

        def nonstream():
            out, usage_box["u"] = _nonstream(client, model)
            return out

        guarded(["chat_nonstream", "completions_nonstream"], nonstream)
        caps = []

        def streams():
            caps.append(stream_capture(http, "/chat/completions", {"model": model, "messages": MESSAGES,
                                                                   "max_tokens": 12, "temperature": 0,
                                                                   "stream": True}, "chat"))
            caps.append(stream_capture(http, "/completions", {"model": model, "prompt": PROMPT, "max_tokens": 12,
                                                              "temperature": 0, "stream": True}, "completions"))
            caps.append(stream_capture(http, "/chat/completions", {"model": model, "messages": MESSAGES,
                                                                   "max_tokens": 8, "n": 2, "temperature": 0.8,
                                                                   "seed": 7, "stream": True}, "chat n=2"))
            caps.append(stream_capture(http, "/chat/completions", {
                "model": model, "messages": MESSAGES, "max_tokens": 12, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}, "chat+usage"))
            return [f(caps) for f in (check_content_type, check_framing, check_done_last, check_stable_ids,
                                      check_first_delta_role, check_finish_once)]

        stream_names = ["stream_content_type", "stream_data_framing", "stream_done_last", "stream_stable_ids",
                        "stream_first_delta_role", "stream_finish_reason_once"]
        if guarded(stream_names, streams) is None:
            caps = []
        guarded(["max_tokens_length"], lambda: _max_tokens(client, model))
        guarded(["stop_strings"], lambda: _stop(client, http, model))
        guarded(["include_usage"], lambda: _include_usage(caps, usage_box.get("u")) if caps else
                CheckResult("include_usage", False, "no stream was captured"))
        guarded(["n_choices"], lambda: _n_choices(client, caps[2] if caps else StreamCapture("none"), model))
        guarded(["error_bad_param"], lambda: _error_shape(
            http.post("/chat/completions", json={"model": model, "messages": MESSAGES, "max_tokens": -5}),
            400, "error_bad_param", "max_tokens=-5"))
        guarded(["error_unknown_model"], lambda: _error_shape(
            http.post("/chat/completions", json={"model": f"{model}-does-not-exist", "messages": MESSAGES,
                                                 "max_tokens": 4}), 404, "error_unknown_model", "unknown model"))
    finally:
        http.close()
        client.close()
    return results


CHECK_NAMES = ("models_list", "chat_nonstream", "completions_nonstream", "stream_content_type",
               "stream_data_framing", "stream_done_last", "stream_stable_ids", "stream_first_delta_role",
               "stream_finish_reason_once", "max_tokens_length", "stop_strings", "include_usage", "n_choices",
               "error_bad_param", "error_unknown_model")
