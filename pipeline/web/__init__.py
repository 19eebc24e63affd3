"""The worker's HTTP surface: webhooks (ingress), the console, /metrics, /healthz, /readyz."""

from pipeline.web._exposure import check_worker_settings, exposure_warnings, is_loopback, worker_problems
from pipeline.web.server import WebDeps, WebServer, build_web_app

__all__ = [
    "WebDeps",
    "WebServer",
    "build_web_app",
    "check_worker_settings",
    "exposure_warnings",
    "is_loopback",
    "worker_problems",
]
