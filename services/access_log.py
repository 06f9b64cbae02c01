"""What an HTTP server of ours logs of each request: its method, its path, the status, the
size of the answer and the time it took; never the query string (a token pasted into an
address ends up there) nor a header (``Authorization``, ``Cookie``, ``Referer``, which
carries another page's address and its query).

aiohttp's default access log writes the whole request line and the ``Referer``: pass
``access_log_class=AccessLog`` to every ``web.AppRunner`` that logs requests.
"""

from __future__ import annotations

from aiohttp.abc import AbstractAccessLogger
from aiohttp.web import BaseRequest, StreamResponse


class AccessLog(AbstractAccessLogger):
    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        self.logger.info(
            "%s %s %d %dB %.3fs",
            request.method,
            request.rel_url.raw_path,  # as sent (still escaped): no forged line breaks
            response.status,
            response.body_length,
            time,
        )
