"""One way to show a URL or an address setting without its credentials.

Every place Switchboard prints or logs a URL setting (the `up` banner, preflight refusals, broker
errors) goes through `redact_url`; the leak check finds the same passwords with `url_passwords`
(pipeline.runtime), so what is hidden on screen is also what a reply may not contain.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import unquote, unquote_plus

REDACTED = "***"

# `scheme://user:password@host` (Redis, Kafka SASL, API base URLs; a user name alone is kept), and
# the password options of a query string (a Redis Sentinel URL's `sentinel_password=`).
_USERINFO_PASSWORD = re.compile(r"(?P<head>://[^/@\s,:]*:)(?P<secret>[^@/\s,]+)(?=@)")
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&](?:sentinel_password|password|token|api_key)=)(?P<secret>[^&\s#]+)")


def redact_url(text: str) -> str:
    """`text` (a URL, a list of them, or a message quoting one) with every password replaced by
    `***`; everything else (scheme, user, host, port, path) kept, so the reader sees which server."""
    text = _USERINFO_PASSWORD.sub(lambda m: m["head"] + REDACTED, text)
    return _QUERY_PASSWORD.sub(lambda m: m["head"] + REDACTED, text)


def url_passwords(text: str) -> Iterator[str]:
    """The passwords `redact_url` hides in `text`, decoded as the server receives them."""
    for match in _USERINFO_PASSWORD.finditer(text):
        yield unquote(match["secret"])
    for match in _QUERY_PASSWORD.finditer(text):
        yield unquote_plus(match["secret"])
