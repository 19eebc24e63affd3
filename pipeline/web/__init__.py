"""The worker's HTTP surface: webhooks (ingress), the console, /metrics, /healthz, /readyz."""

from pipeline.web.server import WebDeps, build_web_app

__all__ = ["WebDeps", "build_web_app"]
