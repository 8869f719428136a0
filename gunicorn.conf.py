"""gunicorn's settings for the web app (read from the working directory: `gunicorn controlplane.wsgi`)."""
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings.production")

bind = [os.environ.get("TANDEM_WEB_BIND", "127.0.0.1:8800")]
workers = int(os.environ.get("TANDEM_WEB_WORKERS", "3"))


def on_starting(server):
    """Refuse DEBUG at a public address, whatever `-b` said."""
    from controlplane.bind_check import debug_bind_exit

    debug_bind_exit(binds=list(server.cfg.bind), process="the web app (gunicorn)")
