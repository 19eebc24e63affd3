# The worker image: slim, non-root, health-checked.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY pipeline ./pipeline
COPY topics ./topics
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 switchboard
COPY --from=build /install /usr/local
COPY topics /app/topics
WORKDIR /app
USER switchboard
ENV SWITCHBOARD_WEB_HOST=0.0.0.0 SWITCHBOARD_WEB_PORT=8080 SWITCHBOARD_LOG_FORMAT=json
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s \
  CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/healthz').status == 200 else 1)"
ENTRYPOINT ["switchboard"]
CMD ["worker"]
