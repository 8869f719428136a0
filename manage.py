#!/usr/bin/env python
"""Django's command-line utility for Tandem (production settings unless DJANGO_SETTINGS_MODULE says otherwise;
`./tandem up` uses controlplane.settings.local)."""
import os
import sys


def _runserver_binds(argv: list[str]) -> list[str]:
    """The address `manage.py runserver [addrport]` will listen on (Django's default: 127.0.0.1:8000)."""
    args = [a for a in argv[2:] if not a.startswith("-")]
    addr = args[0] if args else "127.0.0.1:8000"
    if addr.isdigit():
        return ["127.0.0.1"]
    host = addr.rsplit(":", 1)[0] if ":" in addr and not addr.endswith("]") else addr
    return ["0.0.0.0" if host == "0" else host]


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings.production")
    from django.core.management import execute_from_command_line

    if sys.argv[1:2] == ["runserver"]:
        from controlplane.bind_check import debug_bind_exit

        debug_bind_exit(binds=_runserver_binds(sys.argv), process="runserver")
    execute_from_command_line(sys.argv)
