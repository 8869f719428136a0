"""`python -m gateway` serves the OpenAI-compatible endpoint (the usage drain is `python -m usage drain`)."""
import argparse
import gc
import os
import resource


def _raise_fd_limit() -> None:
    # Every stream holds two sockets (client and upstream): 1,000 streams need more than the usual 1,024.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings.production")
    parser = argparse.ArgumentParser(prog="python -m gateway")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    args = parser.parse_args()

    # Django's settings and its JSON logging, not django.setup(): the request path reads PostgreSQL through its own
    # pool (gateway.store) and never loads the apps or their models (tests/test_layers.py checks that).
    from django.conf import settings
    from django.utils.log import configure_logging

    configure_logging(settings.LOGGING_CONFIG, settings.LOGGING)

    import uvicorn

    from controlplane.bind_check import debug_bind_exit
    from gateway.app import Gateway
    from gateway.config import config_from_settings
    from gateway.forwarded import TrustedProxyHeaders, forwarded_settings_problem
    from gateway.server import protocol_with_limit

    _raise_fd_limit()
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    config = config_from_settings(**overrides)
    debug_bind_exit(binds=[config.host], process="the gateway")  # never DEBUG at a public address
    problem = forwarded_settings_problem(config.forwarded_allow_ips, behind_load_balancer=config.behind_load_balancer)
    if problem:
        raise SystemExit(f"Refusing to start the gateway: {problem}")
    app = Gateway(config)
    # Everything imported so far lives as long as the process: out of the collector's sight, so the collections
    # that each request's garbage triggers do not walk Django, aiohttp and uvicorn's objects again and again.
    gc.freeze()
    # X-Forwarded-For names the client (whose failed authentications are counted) only from trusted proxies.
    uvicorn.run(TrustedProxyHeaders(app, config.forwarded_allow_ips), host=config.host, port=config.port,
                loop="uvloop", http=protocol_with_limit(config.max_header_bytes), lifespan="on", access_log=False,
                server_header=False, log_config=None, backlog=4096, timeout_keep_alive=75,
                proxy_headers=False,  # TrustedProxyHeaders does it
                # SIGTERM: stop accepting, let in-flight requests and streams finish for up to this long, then
                # cut what is left; the pod's terminationGracePeriodSeconds is longer (deploy/base/gateway.yaml).
                timeout_graceful_shutdown=config.drain_timeout_s)


if __name__ == "__main__":
    main()
