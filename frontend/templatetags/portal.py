"""Template helpers for the portal: dict lookups, form fields, and rendering the planner's answer generically."""
import numbers

from django import template
from django.utils.html import format_html, format_html_join

from frontend.spec_form import choices_for
from frontend.views.status import TONES

register = template.Library()


@register.filter
def status_tone(status) -> str:
    """A status badge's tone: the one table of them (frontend.views.status.TONES), never restated in a template."""
    return TONES.get(status, "mute")


@register.filter
def get_item(mapping, key):
    return mapping.get(key) if hasattr(mapping, "get") else None


@register.filter
def humanize_key(key) -> str:
    text = str(key).replace("_", " ").strip()
    for short, long in (("kv", "KV"), ("gpu", "GPU"), ("gpus", "GPUs"), ("tp", "TP"), ("usd", "USD"),
                        ("efa", "EFA"), ("gib", "GiB"), ("gbps", "Gbps"), ("ms", "ms")):
        text = " ".join(long if w.lower() == short else w for w in text.split(" "))
    return text[:1].upper() + text[1:]


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1024
    return f"{n}"


def format_number(key: str, value) -> str:
    k = str(key).lower()
    if isinstance(value, bool):
        return "yes" if value else "no"
    if "bytes" in k and "per_s" not in k and "bandwidth" not in k:
        return _bytes(float(value))
    if "usd" in k or "cost" in k or "price" in k:
        return f"${value:,.2f}"
    if isinstance(value, numbers.Integral):
        return f"{value:,}"
    return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"


@register.simple_tag
def plan_value(key, value):
    """One planner value as HTML: numbers formatted by what the key says, lists and dicts nested."""
    if isinstance(value, dict):
        rows = format_html_join("", "<div><dt>{}</dt><dd>{}</dd></div>",
                                ((humanize_key(k), plan_value(k, v)) for k, v in value.items()))
        return format_html('<dl class="kv nested">{}</dl>', rows)
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, str) for v in value):
            return format_html('<ol class="arith">{}</ol>', format_html_join("", "<li><code>{}</code></li>",
                                                                             ((v,) for v in value)))
        return format_html('<ul class="plain">{}</ul>', format_html_join("", "<li>{}</li>",
                                                                         ((plan_value(key, v),) for v in value)))
    if isinstance(value, numbers.Number):
        return format_html("{}", format_number(key, value))
    if value is None:
        return "—"
    return format_html("{}", value)


PLAN_SHOWN_APART = {"verdict", "verdict_text", "warnings", "arithmetic", "targets", "latency"}
VERDICT_TONES = {"pd_pays": "ok", "single_node_enough": "wait", "does_not_fit": "bad"}


@register.filter
def verdict_tone(verdict) -> str:
    return VERDICT_TONES.get(verdict, "info") if isinstance(verdict, str) else "info"


@register.filter
def plan_items(plan: dict):
    """The plan's keys split into headline scalars first, then nested parts; the verdict is shown apart."""
    if not isinstance(plan, dict):
        return []
    items = [{"key": k, "value": v, "block": isinstance(v, (dict, list, tuple))}
             for k, v in plan.items() if k not in PLAN_SHOWN_APART]
    return sorted(items, key=lambda i: i["block"])


@register.filter
def verdict_text(verdict):
    if isinstance(verdict, dict):
        return verdict.get("summary") or verdict.get("message") or verdict.get("text") or \
            "; ".join(f"{k}: {v}" for k, v in verdict.items())
    return verdict


@register.inclusion_tag("partials/field.html", takes_context=True)
def field(context, f, *, input_type=None):
    """A labelled input with its help text and an error slot that inline validation fills (out of band)."""
    values, errors = context.get("values") or {}, context.get("errors") or {}
    return {"f": f, "value": values.get(f.name, ""), "errors": errors.get(f.name, []),
            "choices": choices_for(f) if f.kind == "select" else None,
            "input_type": input_type or ("number" if f.kind in ("int", "float") else "text")}


@register.filter
def ms(value):
    return "—" if value is None else (f"{value / 1000:.1f} s" if value >= 1000 else f"{value} ms")


@register.filter
def split_words(text: str) -> list[str]:
    return str(text).split()
