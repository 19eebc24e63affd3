"""tests/deploy: static checks of the deployment files, and one real Prometheus scraping a real worker.

The scrape test reuses the integration stack (broker + simulator + worker, module-scoped) and the
console client: re-exported here so pytest finds them for tests in this directory.
"""

from tests.integration.conftest import console, stack

__all__ = ["console", "stack"]
