#!/usr/bin/env python3
"""The models the rollout benchmark (bench/rollout_pd.py) rolls out to, derived from the tiny model offline, in
seconds. Run with the RUNTIME venv's python (torch, transformers):

    $TANDEM_RUNTIME_DIR/venv/bin/python bench/rollout_models.py SOURCE_DIR OUT_ROOT

- `tiny-llama-slow`: the same tokenizer and chat template, a Llama 8 layers deep and 1024 wide (about 100 M
  random weights, ~200 MB bf16): several times the tiny model's compute per token, so its time to first token on
  CPU is well past 1.5× the tiny model's (what the rollout judge must roll back).
- `tiny-llama-nochat`: the source model without a chat template: vLLM refuses chat completions for it, so its
  conformance run fails (what a rollout must roll back before any user reaches it).
Idempotent: a directory already there is left as it is.
"""
import json
import shutil
import sys
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def nochat(source: Path, out: Path) -> None:
    if (out / "config.json").is_file():
        return
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp)
    config = json.loads((tmp / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (tmp / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (tmp / "chat_template.jinja").unlink(missing_ok=True)
    tmp.rename(out)


def slow(source: Path, out: Path) -> None:
    if (out / "config.json").is_file():
        return
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    base = json.loads((source / "config.json").read_text())
    cfg = LlamaConfig(**{**{k: base[k] for k in ("vocab_size", "max_position_embeddings", "rms_norm_eps",
                                                 "bos_token_id", "eos_token_id", "pad_token_id")},
                         "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
                         "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 64,
                         "tie_word_embeddings": True, "torch_dtype": "bfloat16"})
    torch.manual_seed(7)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, tmp / name)
    tmp.rename(out)


def main(argv: list[str]) -> int:
    source, root = Path(argv[0]), Path(argv[1])
    nochat(source, root / "tiny-llama-nochat")
    slow(source, root / "tiny-llama-slow")
    print(f"rollout models ready under {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
