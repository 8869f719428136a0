# syntax=docker/dockerfile:1
# One image for web, gateway, worker, beat and the migrations Job (the Ray/vLLM runtime runs on the cluster).
# Production dependencies only, installed from requirements/prod.lock with --require-hashes (every wheel is
# checked against the hash the lock pins); no test tool, compiler or npm in the final image. The portal's
# front-end libraries are vendored in frontend/static/vendor (frontend/build_assets.sh) and collected here.
# tests/deploy/test_image.py checks all of this statically.

# --- build: a virtualenv with the pinned production dependencies, and the collected static files -------------
FROM python:3.12-slim-trixie AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /venv
COPY requirements/prod.lock /tmp/prod.lock
RUN /venv/bin/pip install --require-hashes --no-deps --only-binary=:all: -r /tmp/prod.lock
WORKDIR /app
COPY manage.py gunicorn.conf.py ./
COPY controlplane ./controlplane
COPY deployments ./deployments
COPY frontend ./frontend
COPY gateway ./gateway
COPY observability ./observability
COPY usage ./usage
COPY workers ./workers
COPY k8s_templates ./k8s_templates
# The project itself, without dependencies (the lock above holds them and the build backend): /venv/bin/tandemctl.
COPY pyproject.toml ./
COPY tandemctl ./tandemctl
RUN /venv/bin/pip install --no-deps --no-build-isolation --no-index . && rm -rf build tandem.egg-info
RUN rm -rf frontend/node_modules \
 && DJANGO_SETTINGS_MODULE=controlplane.settings.production DJANGO_SECRET_KEY=collectstatic-only \
    TANDEM_KEY_HMAC_SECRET=collectstatic-only /venv/bin/python manage.py collectstatic --noinput

# --- runtime: the virtualenv, the code and the static files, run as an unprivileged user ---------------------
FROM python:3.12-slim-trixie
RUN groupadd --gid 10001 tandem && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin tandem
# gunicorn.conf.py binds TANDEM_WEB_BIND; inside the container that is every interface.
ENV PATH=/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    DJANGO_SETTINGS_MODULE=controlplane.settings.production TANDEM_WEB_BIND=0.0.0.0:8800
COPY --from=build /venv /venv
COPY --from=build --chown=root:root /app /app
WORKDIR /app
# Numeric, so Kubernetes can check runAsNonRoot; the root filesystem is mounted read-only (deploy/): only /tmp
# (an emptyDir) is written.
USER 10001:10001
EXPOSE 8800 8801
CMD ["gunicorn", "controlplane.wsgi"]
