"""`python -m usage drain`: move the gateways' request records into PostgreSQL in a loop, for deployments that run
no Celery beat (with beat, usage.tasks.drain_request_records does it every 5 s)."""
import argparse
import os


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings.production")
    parser = argparse.ArgumentParser(prog="python -m usage")
    parser.add_argument("command", choices=["drain"])
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between passes when nothing is left")
    args = parser.parse_args()

    import django

    django.setup()
    from usage.drain import drain_forever

    drain_forever(interval=args.interval)


if __name__ == "__main__":
    main()
