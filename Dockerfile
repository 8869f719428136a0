# One image for web, worker, beat and gateway (the Ray/vLLM runtime runs on the cluster, not here).
# It installs the production lock only, every file checked against its hash: no test tools ship.
FROM python:3.12-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 DJANGO_SETTINGS_MODULE=controlplane.settings.production
WORKDIR /app
COPY requirements/prod.lock requirements/prod.lock
RUN pip install --no-cache-dir --require-hashes --no-deps -r requirements/prod.lock
COPY . .
RUN DJANGO_SECRET_KEY=build TANDEM_KEY_HMAC_SECRET=build python manage.py collectstatic --noinput \
    && useradd --system --no-create-home tandem
USER tandem
# gunicorn.conf.py binds TANDEM_WEB_BIND; inside the container that is every interface.
ENV TANDEM_WEB_BIND=0.0.0.0:8800
EXPOSE 8800 8801
CMD ["gunicorn", "controlplane.wsgi"]
