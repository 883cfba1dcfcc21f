"""The ASGI guard in front of the HTTP API: API key (401), header size (431), body size (413) and body-read
timeout (408), answered before FastAPI sees the request."""

import asyncio
import hmac
import json
from typing import Any

from fastapi import HTTPException


class Guard:
    """Pure ASGI middleware: refuses requests without the API key (401), headers over `max_header` bytes (431),
    bodies over `max_body` (413; by Content-Length before reading and by counting streamed chunks) and
    bodies whose next chunk takes over `body_timeout_s` to arrive (408: a slow client holds no connection)."""

    def __init__(self, app: Any, api_key: str | None, max_body: int, max_header: int = 16384,
                 body_timeout_s: float = 5.0) -> None:
        self.app, self.max_body, self.max_header, self.body_timeout_s = app, max_body, max_header, body_timeout_s
        self.key = api_key.encode() if api_key else None

    def _authorised(self, headers: dict[bytes, bytes]) -> bool:
        given = headers.get(b"x-api-key")
        auth = headers.get(b"authorization", b"")
        if given is None and auth[:7].lower() == b"bearer ":
            given = auth[7:].strip()
        return given is not None and hmac.compare_digest(given, self.key)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        raw = scope.get("headers") or []
        if sum(len(k) + len(v) for k, v in raw) > self.max_header:
            return await _send_error(send, 431, f"request headers over {self.max_header} bytes")
        headers = dict(raw)
        if self.key is not None and not self._authorised(headers):
            return await _send_error(send, 401, "missing or wrong API key (send header X-API-Key)")
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return await _send_error(send, 413, f"request body over {self.max_body} bytes")
        await self.app(scope, self._limited(receive), send)

    def _limited(self, receive: Any) -> Any:
        """`receive` counting body bytes (413) and timing each body chunk (408) until the body is complete."""
        seen, done = 0, False

        async def limited() -> dict:
            nonlocal seen, done
            if done:  # after the body: a wait for the disconnect, unbounded
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.body_timeout_s)
            except asyncio.TimeoutError:
                raise HTTPException(408, f"request body not received within {self.body_timeout_s} s") from None
            seen += len(message.get("body", b""))
            done = message.get("type") != "http.request" or not message.get("more_body", False)
            if seen > self.max_body:
                raise HTTPException(413, f"request body over {self.max_body} bytes")
            return message

        return limited


async def _send_error(send: Any, status: int, message: str) -> None:
    body = json.dumps({"error": message, "detail": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
