"""TTFT and end-to-end on the local PD stack, direct to Ray Serve vs through Tandem's gateway, side by side.

    python -m bench.local_pd_latency --direct http://127.0.0.1:8000/v1 --gateway http://127.0.0.1:8801/v1 \
        --key tdm_... --model tiny-llama --runs 10

Requests alternate between the two paths so both see the same machine load.
"""
import argparse
import statistics
import time

from openai import OpenAI

PROMPT = [{"role": "user", "content": "Write one sentence about the sea."}]


def _one(client: OpenAI, model: str) -> tuple[float, float]:
    started = time.perf_counter()
    ttft = None
    for chunk in client.chat.completions.create(model=model, messages=PROMPT, max_tokens=32, stream=True,
                                                temperature=0):
        if ttft is None and chunk.choices and chunk.choices[0].delta.content:
            ttft = time.perf_counter() - started
    return ttft or float("nan"), time.perf_counter() - started


def latency_samples(*, direct_url: str, gateway_url: str, api_key: str, model: str, runs: int = 10,
                    warmup: int = 2) -> dict[str, list[tuple[float, float]]]:
    """(TTFT, end-to-end) in seconds of each of `runs` streamed chats per path, alternating (the i-th of each path
    ran back to back: a pair), after `warmup` unmeasured chats on each path."""
    clients = {"direct": OpenAI(base_url=direct_url, api_key="unused", max_retries=0, timeout=120),
               "gateway": OpenAI(base_url=gateway_url, api_key=api_key, max_retries=0, timeout=120)}
    samples = {name: [] for name in clients}
    for i in range(warmup + runs):
        for name, client in clients.items():
            sample = _one(client, model)
            if i >= warmup:
                samples[name].append(sample)
    return samples


def medians(samples: dict[str, list[tuple[float, float]]]) -> dict[str, tuple[float, float]]:
    """Median (TTFT, end-to-end) per path."""
    return {name: (statistics.median(t for t, _ in s), statistics.median(e for _, e in s))
            for name, s in samples.items()}


def latency_p50(*, runs: int = 10, **kwargs) -> dict[str, tuple[float, float]]:
    """Median (TTFT, end-to-end) in seconds per path over `runs` streamed chats each (latency_samples)."""
    return medians(latency_samples(runs=runs, **kwargs))


def latency_table(p50: dict[str, tuple[float, float]], runs: int) -> str:
    (dt, de), (gt, ge) = p50["direct"], p50["gateway"]
    return (f"local PD, {runs} streamed chats per path, 32 tokens, p50:\n"
            f"  TTFT  direct {dt * 1000:7.1f} ms  gateway {gt * 1000:7.1f} ms  added {(gt - dt) * 1000:+6.1f} ms  "
            f"ratio {gt / dt:.3f}\n"
            f"  e2e   direct {de * 1000:7.1f} ms  gateway {ge * 1000:7.1f} ms  added {(ge - de) * 1000:+6.1f} ms  "
            f"ratio {ge / de:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--direct", required=True)
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--runs", type=int, default=10)
    a = parser.parse_args()
    print(latency_table(latency_p50(direct_url=a.direct, gateway_url=a.gateway, api_key=a.key, model=a.model,
                                    runs=a.runs), a.runs))


if __name__ == "__main__":
    main()
