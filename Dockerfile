# One image for web, worker, beat and gateway (the Ray/vLLM runtime runs on the cluster, not here).
FROM python:3.12-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 DJANGO_SETTINGS_MODULE=controlplane.settings.production
WORKDIR /app
COPY requirements.lock .
RUN pip install --no-cache-dir -r requirements.lock
COPY . .
RUN DJANGO_SECRET_KEY=build TANDEM_KEY_HMAC_SECRET=build python manage.py collectstatic --noinput
EXPOSE 8800 8801
CMD ["gunicorn", "controlplane.wsgi", "-b", "0.0.0.0:8800", "-w", "3"]
