# The worker image: slim, non-root, health-checked.
#   docker build -t switchboard:latest .
#   docker run --rm switchboard:latest worker      # settings from SWITCHBOARD_* (README, "Configuration")
# One image runs every role: `worker`, `topics apply`, `sim`.
# It listens on 0.0.0.0: the console stays off unless SWITCHBOARD_CONSOLE_ENABLED=true (and then a
# token is required), and /metrics answers only with SWITCHBOARD_METRICS_TOKEN set.

FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY pipeline ./pipeline
# The topic catalogue (pipeline/topics/) and the Lua scripts are package data: the wheel carries
# them. Dependencies at the versions the tests passed with.
RUN pip install --prefix=/install -c constraints.txt .

FROM python:3.11-slim
# Faust creates its data directory at start: keep it in the app directory the user owns.
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    FAUST_DATADIR=/app/data \
    SWITCHBOARD_WEB_HOST=0.0.0.0 SWITCHBOARD_WEB_PORT=8080 SWITCHBOARD_LOG_FORMAT=json
RUN groupadd --gid 10001 switchboard \
 && useradd --create-home --uid 10001 --gid 10001 switchboard \
 && install -d -o switchboard -g switchboard /app /app/data
COPY --from=build /install /usr/local
# Fails the build (not the first deployment) if the topic catalogue did not make it into the image.
RUN python -c "from pipeline.topics import declarations; assert declarations(['console'], 8)"
WORKDIR /app
USER 10001:10001
EXPOSE 8080
# Liveness of the web server; readiness (Redis, runtime started) is /readyz, used by the proxy and k8s.
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import os, sys, urllib.request; port = os.environ.get('SWITCHBOARD_WEB_PORT', '8080'); sys.exit(0 if urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=2).status == 200 else 1)"]
# SIGTERM (docker stop, k8s) lets the Faust worker stop its agents, commit what is acknowledged and
# leave the consumer group; `docker stop -t`/terminationGracePeriodSeconds must cover it.
STOPSIGNAL SIGTERM
ENTRYPOINT ["switchboard"]
CMD ["worker"]
