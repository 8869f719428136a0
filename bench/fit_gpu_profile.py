"""Fit a GPU's performance profile to a measurement file (bench/gpu_profile.py's format) and print the error
at every measured point, and of fits on one model checked on the others.

    .venv/bin/python -m bench.fit_gpu_profile MEASUREMENT.json --gpu H200 --date 2026-12-04 \
        [--out observability/profiles/h200.json]
"""
import argparse
import json
import os
import sys

from observability.profile_fit import profile_fit


def _table(title: str, errors: dict) -> list[str]:
    lines = [title, f"  {'model':<14} {'shape':<16} {'measured ms':>12} {'predicted ms':>13} {'error':>8}"]
    for e in errors["prefill"]:
        lines.append(f"  {e['model']:<14} {'prefill ' + str(e['tokens']):<16} {e['measured_ms']:>12,.3f} "
                     f"{e['predicted_ms']:>13,.3f} {e['error']:>+8.1%}")
    for e in errors["decode"]:
        lines.append(f"  {e['model']:<14} {'decode ' + str(e['sequences']) + '×' + str(e['context']):<16} "
                     f"{e['measured_ms']:>12,.3f} {e['predicted_ms']:>13,.3f} {e['error']:>+8.1%}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("measurement")
    ap.add_argument("--gpu", required=True, help="the catalog's GPU name (deployments/catalog.py GPUS), e.g. H200")
    ap.add_argument("--date", required=True, help="when it was measured (YYYY-MM-DD)")
    ap.add_argument("--source", help="what the plan names as the profile's source (default: the file's name)")
    ap.add_argument("--out", help="write the profile JSON here")
    args = ap.parse_args(argv)
    with open(args.measurement, encoding="utf-8") as f:
        measurement = json.load(f)
    name = os.path.basename(args.measurement)
    source = args.source or f"{name} ({measurement.get('device', args.gpu)}, torch {measurement.get('torch', '?')}, " \
                            f"{args.date})"
    profile = profile_fit(measurement, gpu=args.gpu, source=source, date=args.date)
    print(json.dumps(profile["coefficients"], indent=1))
    print("\n".join(_table(f"Fit on every model of {name}:", profile["errors"])))
    for h in profile["holdout"]:
        title = f"Fitted on {', '.join(h['fitted_on'])} only, checked on {', '.join(h['checked_on'])}:"
        errors = {stage: h[stage].get("errors", []) for stage in ("prefill", "decode")}
        failed = [f"  {stage}: {h[stage]['failed']}" for stage in ("prefill", "decode") if "failed" in h[stage]]
        print("\n".join(_table(title, errors) + failed))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(profile, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
