"""Measure one GPU into the performance model's measurement format (the shared H200 table's:
../shared/data/gpu/h200-20261204-llama8b-qwen32b.json), for bench/fit_gpu_profile.py to fit.

Llama-shaped decoders with random bf16 weights (untied embeddings), built here in plain torch: fused QKV and
gate/up matmuls, RMSNorm, RoPE, scaled_dot_product_attention with grouped KV heads. Nothing is downloaded.
- prefill: one sequence of `tokens`, logits for the last position only; median of 5 CUDA-event-timed runs after
  2 warm-ups;
- decode: one step for `sequences` running sequences each holding `context` tokens of KV (the new token's K and V
  written into a static cache), captured once in a CUDA graph and replayed; median of 30 timed replays after 3.
- the GPU's own yardsticks: a bf16 8192³ matmul (TFLOP/s) and a device-to-device copy (GB/s, read + write).

    python -m bench.gpu_profile --out gpu.json [--models llama-3.1-8b,qwen2.5-32b] [--quick]

Needs torch with CUDA and a GPU with room for the largest model's weights and KV (Qwen2.5-32B's shape: 66 GB of
weights, 34 GB of KV at 64 × 2,048): `--models llama-3.1-8b` alone needs about 85 GB at 128 × 4,096.
Written without a GPU at hand (2026-12-04): it has not been run yet; see bench/README.md.
"""
import argparse
import datetime as dt
import json
import statistics
import sys

SHAPES = {
    "llama-3.1-8b": {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128, "inter": 14336,
                     "vocab": 128256},
    "qwen2.5-32b": {"layers": 64, "hidden": 5120, "heads": 40, "kv_heads": 8, "head_dim": 128, "inter": 27648,
                    "vocab": 152064},
}
# The shared table's points: prefill prompt lengths, decode (sequences, context).
POINTS = {
    "llama-3.1-8b": ([128, 512, 2048, 8192, 32768], [(1, 1024), (8, 2048), (32, 2048), (64, 4096), (128, 4096)]),
    "qwen2.5-32b": ([512, 2048, 8192], [(1, 1024), (16, 2048), (64, 2048)]),
}
QUICK = {"llama-3.1-8b": ([128, 2048], [(1, 1024), (32, 2048)]), "qwen2.5-32b": ([2048], [(16, 2048)])}
PREFILL_RUNS, DECODE_RUNS = 5, 30


def params_of(s: dict) -> int:
    per_layer = s["hidden"] * (s["heads"] + 2 * s["kv_heads"]) * s["head_dim"] + s["heads"] * s["head_dim"] * \
        s["hidden"] + 3 * s["hidden"] * s["inter"] + 2 * s["hidden"]
    return 2 * s["vocab"] * s["hidden"] + s["layers"] * per_layer + s["hidden"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--quick", action="store_true", help="a few points per model (a smoke run)")
    args = ap.parse_args(argv)
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("Needs torch with CUDA (pip install torch on the GPU machine; Tandem's own environment has none).",
              file=sys.stderr)
        return 2

    if not torch.cuda.is_available():
        print("No CUDA device: this measures a GPU.", file=sys.stderr)
        return 2
    dev, bf16 = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)

    def timed(fn, runs: int, warmup: int) -> list[float]:
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        out = []
        for _ in range(runs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
        return out

    def summary(ms: list[float]) -> dict:
        return {"ms": round(statistics.median(ms), 3), "ms_min": round(min(ms), 3), "ms_max": round(max(ms), 3)}

    def rand(*shape):
        return torch.empty(*shape, device=dev, dtype=bf16).normal_(0, 0.02)

    class Decoder:
        """Random weights in a Llama's layout; `prefill` and `decode_step` are the measured work."""

        def __init__(self, s: dict):
            self.s = s
            h, hd = s["hidden"], s["head_dim"]
            self.embed, self.lm_head, self.norm = rand(s["vocab"], h), rand(h, s["vocab"]), torch.ones(h, device=dev,
                                                                                                       dtype=bf16)
            self.layers = [{"qkv": rand(h, (s["heads"] + 2 * s["kv_heads"]) * hd), "o": rand(s["heads"] * hd, h),
                            "gate_up": rand(h, 2 * s["inter"]), "down": rand(s["inter"], h),
                            "n1": torch.ones(h, device=dev, dtype=bf16), "n2": torch.ones(h, device=dev, dtype=bf16)}
                           for _ in range(s["layers"])]
            inv = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, device=dev, dtype=torch.float32) / hd))
            self.inv_freq = inv

        def rope_at(self, positions):
            f = torch.outer(positions.float(), self.inv_freq)
            return f.cos().to(bf16)[:, None, :], f.sin().to(bf16)[:, None, :]

        @staticmethod
        def rope(x, cos, sin):
            half = x.shape[-1] // 2
            x1, x2 = x[..., :half], x[..., half:]
            return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

        def split(self, qkv, n):
            s = self.s
            q, k, v = qkv.split([s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"],
                                 s["kv_heads"] * s["head_dim"]], dim=-1)
            return (q.view(n, s["heads"], s["head_dim"]), k.view(n, s["kv_heads"], s["head_dim"]),
                    v.view(n, s["kv_heads"], s["head_dim"]))

        def mlp(self, x, w):
            g, u = (F.rms_norm(x, (x.shape[-1],), w["n2"]) @ w["gate_up"]).chunk(2, dim=-1)
            return x + (F.silu(g) * u) @ w["down"]

        def prefill(self, ids):
            t = ids.shape[0]
            x = self.embed[ids]
            cos, sin = self.rope_at(torch.arange(t, device=dev))
            for w in self.layers:
                q, k, v = self.split(F.rms_norm(x, (x.shape[-1],), w["n1"]) @ w["qkv"], t)
                q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
                a = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                                   v.transpose(0, 1)[None], is_causal=True, enable_gqa=True)
                x = x + a[0].transpose(0, 1).reshape(t, -1) @ w["o"]
                x = self.mlp(x, w)
            return F.rms_norm(x[-1:], (x.shape[-1],), self.norm) @ self.lm_head

        def decode_step(self, ids, caches, position: int, cos, sin):
            """One decode step: each sequence's new token at `position`, its K and V written into the cache."""
            b = ids.shape[0]
            x = self.embed[ids]
            for w, (kc, vc) in zip(self.layers, caches, strict=True):
                q, k, v = self.split(F.rms_norm(x, (x.shape[-1],), w["n1"]) @ w["qkv"], b)
                q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
                kc[:, :, position] = k
                vc[:, :, position] = v
                a = F.scaled_dot_product_attention(q[:, :, None], kc, vc, enable_gqa=True)
                x = x + a.reshape(b, -1) @ w["o"]
                x = self.mlp(x, w)
            return F.rms_norm(x, (x.shape[-1],), self.norm) @ self.lm_head

    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
              "date": dt.date.today().isoformat(), "models": {}, "shapes": {}}
    with torch.inference_mode():
        a, b = rand(8192, 8192), rand(8192, 8192)
        mm = summary(timed(lambda: a @ b, 20, 5))
        result["matmul_8192_tflops"] = round(2 * 8192**3 / (mm["ms"] / 1000) / 1e12, 1)
        src = torch.empty(4 * 1024**3, device=dev, dtype=torch.uint8)
        dst = torch.empty_like(src)
        cp = summary(timed(lambda: dst.copy_(src), 20, 5))
        result["hbm_copy_gbs"] = round(2 * src.numel() / (cp["ms"] / 1000) / 1e9, 1)
        del a, b, src, dst
        print(f"{result['device']}: matmul {result['matmul_8192_tflops']} TFLOP/s, copy {result['hbm_copy_gbs']} GB/s")
        for name in args.models.split(","):
            s = SHAPES[name]
            model = Decoder(s)
            kv_per_token = 2 * s["layers"] * s["kv_heads"] * s["head_dim"] * 2
            entry = {"params": params_of(s), "kv_bytes_per_token": kv_per_token, "prefill": [], "decode": []}
            prefill_points, decode_points = (QUICK if args.quick else POINTS)[name]
            for tokens in prefill_points:
                ids = torch.randint(0, s["vocab"], (tokens,), device=dev)
                point = {"tokens": tokens, **summary(timed(lambda ids=ids: model.prefill(ids), PREFILL_RUNS, 2))}
                entry["prefill"].append(point)
                print(f"{name} prefill {tokens}: {point['ms']} ms")
            for seqs, context in decode_points:
                caches = [(rand(seqs, s["kv_heads"], context + 1, s["head_dim"]),
                           rand(seqs, s["kv_heads"], context + 1, s["head_dim"])) for _ in range(s["layers"])]
                ids = torch.randint(0, s["vocab"], (seqs,), device=dev)
                cos, sin = model.rope_at(torch.tensor([context], device=dev))

                def one_step(ids=ids, caches=caches, context=context, cos=cos, sin=sin):
                    return model.decode_step(ids, caches, context, cos, sin)

                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):  # warm-up off the capture stream, as CUDA graphs require
                    for _ in range(3):
                        one_step()
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    one_step()
                point = {"sequences": seqs, "context": context, "mode": "cuda-graph",
                         **summary(timed(graph.replay, DECODE_RUNS, 3))}
                point["tokens_per_s"] = round(seqs / (point["ms"] / 1000), 1)
                entry["decode"].append(point)
                print(f"{name} decode {seqs}×{context}: {point['ms']} ms")
                del graph, caches
                torch.cuda.empty_cache()
            result["models"][name], result["shapes"][name] = entry, s
            del model
            torch.cuda.empty_cache()
    result["method"] = (f"One {result['device']}, torch {result['torch']} + CUDA {result['cuda']}, {result['date']}, "
                        "bench/gpu_profile.py: " + " ".join(__doc__.split("\n\n")[1].split()))
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}; fit it with: python -m bench.fit_gpu_profile {args.out} --gpu <catalog GPU> "
          f"--date {result['date']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
