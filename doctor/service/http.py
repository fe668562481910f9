"""One HTTP exchange with a server that may misbehave, bounded in time and size (``smoke``, ``wait-ready``).

``urllib``'s timeout bounds each socket operation, not the exchange: a server that drips a byte every second,
or never ends its body, keeps a reader waiting forever. Here one deadline covers connecting, sending, the
status line, the headers and the whole body: each read gets what is left of it, and a watchdog shuts the
socket down when it passes (a read blocked inside ``http.client`` returns at once); a body larger than
``limit`` stops the read. Credentials in the URL (``http://user:pass@host``) become a Basic
``Authorization`` header and are never part of what is shown (``shown_url``).
"""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass

from doctor.core.fileio import size_words
from doctor.core.printable import printable

MAX_BODY = 8 * 1024 * 1024  # an answer of the server larger than this is not an answer the doctor reads
REFUSED, TIMEOUT, FAILED = "refused", "timeout", "failed"


@dataclass
class Reply:
    """What came back: the status and body, or ``error`` (``kind``: refused, timeout, failed)."""

    status: int | None = None
    body: bytes = b""
    error: str | None = None
    kind: str | None = None
    seconds: float = 0.0


def shown_url(url: str) -> str:
    """``url`` without its userinfo, for every message."""
    from doctor.facts.redaction import redact_text

    return redact_text(url)


def split(url: str) -> tuple[str, str, int | None, str, str | None]:
    """(scheme, host, port, path with query, userinfo or None); ``ValueError`` for a URL that is none."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port  # ValueError for a bad port
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http(s) URL with a host")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else None
    return parts.scheme, parts.hostname, port, path, userinfo


def request(url: str, timeout: float, *, method: str = "GET", body: bytes | None = None,
            headers: dict[str, str] | None = None, limit: int = MAX_BODY,
            context: ssl.SSLContext | None = None) -> Reply:
    """One request within ``timeout`` seconds in all (see the module docstring); never raises. ``context``: the
    TLS context of an https URL (a cluster's CA)."""
    t0 = time.monotonic()
    end = t0 + max(0.01, timeout)
    try:
        scheme, host, port, path, userinfo = split(url)
    except ValueError as exc:
        return Reply(error=f"not a valid URL ({exc})", kind=FAILED)
    heads = dict(headers or {})
    if userinfo:
        heads.setdefault("Authorization", "Basic " + base64.b64encode(
            urllib.parse.unquote(userinfo).encode()).decode())
    conn: http.client.HTTPConnection
    if scheme == "https":
        conn = http.client.HTTPSConnection(host, port, timeout=max(0.01, timeout), context=context)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=max(0.01, timeout))
    cut = threading.Event()

    def watchdog() -> None:
        cut.set()
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(max(0.01, timeout), watchdog)
    timer.daemon = True
    timer.start()
    reply = Reply()
    try:
        conn.request(method, path, body=body, headers=heads)
        resp = conn.getresponse()
        reply.status = resp.status
        parts: list[bytes] = []
        size = 0
        while True:
            left = end - time.monotonic()
            if left <= 0 or cut.is_set():
                raise TimeoutError
            if conn.sock is not None:
                conn.sock.settimeout(left)
            chunk = resp.read1(65536)
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
            if size > limit:
                reply.error, reply.kind = f"the answer is larger than {size_words(limit)}: not read further", FAILED
                break
        if cut.is_set() and reply.error is None:
            raise TimeoutError
        reply.body = b"".join(parts)
    except ConnectionRefusedError:
        reply.status, reply.error, reply.kind = None, "connection refused", REFUSED
    except TimeoutError:
        reply.error, reply.kind = f"no complete answer within {timeout:.0f}s (timed out)", TIMEOUT
    except (http.client.HTTPException, OSError, ValueError) as exc:
        if cut.is_set():
            reply.error, reply.kind = f"no complete answer within {timeout:.0f}s (timed out)", TIMEOUT
        else:
            # http.client quotes what the server sent (a status line): its words, never its control characters
            reply.error, reply.kind = printable(f"{type(exc).__name__}: {exc}".rstrip(": ")), FAILED
    finally:
        timer.cancel()
        conn.close()
        reply.seconds = time.monotonic() - t0
    return reply
