"""What the planner and the performance model know about a decoder: its shape, parameters and dtype, from entered
values or a config.json. Pure."""
from dataclasses import dataclass

from deployments.spec import SpecError

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float8": 1, "fp8": 1}


@dataclass(frozen=True)
class ModelFacts:
    """A decoder's shape. `vocab_size` (optional) lets the performance model leave the embedding table out of the
    per-token work: it is a lookup, and only the last position's logits are computed in prefill."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    param_count: int
    dtype: str = "bfloat16"
    vocab_size: int | None = None
    tie_word_embeddings: bool = False


def _int(data: dict, *keys, required=True):
    for k in keys:
        v = data.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    if required:
        raise SpecError({f"model_facts.{keys[0]}": [f"A positive whole number is required (one of {', '.join(keys)})."]})
    return None


def estimate_params(cfg: dict) -> int | None:
    """Parameters of a Llama-style decoder from its config.json (embeddings, attention, gated MLP, norms)."""
    h, layers, inter, vocab = (cfg.get(k) for k in ("hidden_size", "num_hidden_layers", "intermediate_size",
                                                    "vocab_size"))
    if not all(isinstance(x, int) for x in (h, layers, inter, vocab)):
        return None
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads)
    hd = cfg.get("head_dim") or h // heads
    per_layer = h * heads * hd * 2 + h * kv * hd * 2 + 3 * h * inter + 2 * h
    lm_head = 0 if cfg.get("tie_word_embeddings") else vocab * h
    return vocab * h + layers * per_layer + h + lm_head


def model_facts_parse(data: dict) -> ModelFacts:
    """Facts from entered values or a config.json's keys (num_hidden_layers, num_key_value_heads, ...)."""
    if not isinstance(data, dict):
        raise SpecError({"model_facts": ["Must be an object."]})
    layers = _int(data, "num_layers", "num_hidden_layers")
    hidden = _int(data, "hidden_size")
    heads = _int(data, "num_attention_heads")
    kv = _int(data, "num_kv_heads", "num_key_value_heads", required=False) or heads
    head_dim = _int(data, "head_dim", required=False) or hidden // heads
    params = _int(data, "param_count", required=False) or estimate_params(data)
    if not params:
        raise SpecError({"model_facts.param_count": ["Give param_count, or intermediate_size and vocab_size so it "
                                                     "can be estimated."]})
    dtype = data.get("dtype") or data.get("torch_dtype") or "bfloat16"
    if dtype not in DTYPE_BYTES:
        raise SpecError({"model_facts.dtype": [f"One of {', '.join(DTYPE_BYTES)}; got {dtype!r}."]})
    tied = data.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise SpecError({"model_facts.tie_word_embeddings": ["Must be true or false."]})
    return ModelFacts(layers, hidden, heads, kv, head_dim, params, dtype,
                      vocab_size=_int(data, "vocab_size", required=False), tie_word_embeddings=tied)
