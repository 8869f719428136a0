#!/usr/bin/env python3
"""Build a tiny random-weight Llama for the local PD target, offline, in seconds.

Run with the RUNTIME venv's python (it needs torch, transformers and tokenizers):

    $TANDEM_RUNTIME_DIR/venv/bin/python local/build_tiny_model.py [OUT_DIR] [--force] [--seed N]

OUT_DIR defaults to ${TANDEM_RUNTIME_DIR:-~/.cache/tandem/pd-runtime}/models/tiny-llama. A second model whose
greedy answers differ from the first's (so a test can tell whose weights answered): `--seed N --untied-head` draws
other random weights with an output head of its own (same tokenizer). The seed alone is not enough: with tied
embeddings a random tiny model mostly repeats its last input token, whatever the seed.
Shape: hidden 128, 2 layers, 2 attention heads and 2 KV heads (head_dim 64), intermediate 192,
vocab from a byte-level BPE tokenizer trained here on generated text, chat template in
tokenizer_config.json, bf16 safetensors, under 1 MB. Deterministic (fixed seed). Idempotent: a
complete directory (stamp file written last) is left as it is. Nothing is downloaded from any hub.
KV per token = 2 (K,V) x 2 layers x 2 KV heads x 64 x 2 bytes (bf16) = 1,024 bytes.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SEED = 1234
VOCAB_SIZE = 1024
MAX_POSITIONS = 2048
STAMP_NAME = ".tandem-tiny-model.json"
SPEC = {
    "builder": "tandem build_tiny_model v1",
    "seed": SEED,
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 192,
    "vocab_size_target": VOCAB_SIZE,
    "max_position_embeddings": MAX_POSITIONS,
    "dtype": "bfloat16",
}
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                  "generation_config.json")

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>", "<|system|>", "<|user|>",
                  "<|assistant|>", "<|end|>"]


def default_out_dir() -> Path:
    rt = os.environ.get("TANDEM_RUNTIME_DIR") or os.path.expanduser("~/.cache/tandem/pd-runtime")
    return Path(rt) / "models" / "tiny-llama"


def spec_for(seed: int, untied: bool) -> dict:
    return {**SPEC, "seed": seed, **({"tie_word_embeddings": False} if untied else {})}


def is_complete(out: Path, seed: int = SEED, untied: bool = False) -> bool:
    stamp = out / STAMP_NAME
    if not stamp.is_file() or not all((out / f).is_file() for f in REQUIRED_FILES):
        return False
    try:
        return json.loads(stamp.read_text()).get("spec") == spec_for(seed, untied)
    except ValueError:
        return False


def corpus(n_lines: int = 8000) -> list[str]:
    """Deterministic English-ish text for the tokenizer to learn from."""
    rng = random.Random(SEED)
    subjects = ["the model", "a user", "the cluster", "prefill", "decode", "the gateway", "an engineer",
                "the scheduler", "a request", "the cache", "ray serve", "the node", "tandem", "vllm"]
    verbs = ["sends", "moves", "reads", "writes", "answers", "routes", "computes", "streams", "checks",
             "starts", "stops", "measures", "deploys", "scales", "returns"]
    objects = ["tokens", "the prompt", "kv blocks", "a reply", "metrics", "the weights", "an error",
               "latency", "bytes", "a chat completion", "the config", "hello world", "numbers 0123456789"]
    tails = ["quickly.", "on the cpu.", "over nixl.", "to the client!", "again?", "with care.", "today.",
             "in json: {\"ok\": true}", "per second.", "before noon."]
    syllables = ["ka", "to", "ri", "mo", "sen", "la", "dor", "pi", "ex", "qu", "ul", "zan", "fe", "gro", "vy",
                 "th", "sh", "ion", "ing", "ed", "er", "al", "ne", "bo", "wi", "ch", "ar", "es", "st", "um"]
    lines = []
    for _ in range(n_lines):
        words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(2, 6))]
        s = (f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)} {' '.join(words)} "
             f"{rng.choice(tails)}")
        lines.append(s.capitalize() if rng.random() < 0.5 else s)
    return lines


def build(out: Path, seed: int = SEED, untied: bool = False) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    random.seed(SEED)  # the tokenizer is the same for every seed; only the weights differ

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    # Byte-level BPE tokenizer trained locally.
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer=trainer)
    bos_id = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos_id)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|end|>", pad_token="<|pad|>",
        model_max_length=MAX_POSITIONS)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(tmp)
    # Make sure the chat template sits in tokenizer_config.json (newer transformers may write
    # chat_template.jinja instead); vLLM and HF both read it from there.
    tc_path = tmp / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc["chat_template"] = CHAT_TEMPLATE
    tc_path.write_text(json.dumps(tc, indent=2) + "\n")
    (tmp / "chat_template.jinja").unlink(missing_ok=True)

    vocab = len(fast)
    eos_id = fast.convert_tokens_to_ids("<|end|>")
    pad_id = fast.convert_tokens_to_ids("<|pad|>")
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=SPEC["hidden_size"], intermediate_size=SPEC["intermediate_size"],
        num_hidden_layers=SPEC["num_hidden_layers"], num_attention_heads=SPEC["num_attention_heads"],
        num_key_value_heads=SPEC["num_key_value_heads"], head_dim=SPEC["head_dim"],
        max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=not untied, bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(tmp, safe_serialization=True)
    GenerationConfig(bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id).save_pretrained(tmp)

    n_params = sum(p.numel() for p in model.parameters())
    size = sum(f.stat().st_size for f in tmp.iterdir() if f.is_file())
    (tmp / STAMP_NAME).write_text(json.dumps(
        {"spec": spec_for(seed, untied), "vocab_size": vocab, "params": n_params, "bytes": size}, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    head = ", untied head" if untied else ""
    print(f"built tiny-llama (seed {seed}{head}): {n_params} params, vocab {vocab}, {size} bytes on disk -> {out}")


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--untied-head", action="store_true")
    a = ap.parse_args(argv)
    out = Path(a.out).expanduser().resolve() if a.out else default_out_dir()
    if not a.force and is_complete(out, a.seed, a.untied_head):
        print(f"tiny-llama (seed {a.seed}) already complete at {out}")
        return 0
    t0 = time.monotonic()
    out.parent.mkdir(parents=True, exist_ok=True)
    build(out, a.seed, a.untied_head)
    print(f"build time {time.monotonic() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
