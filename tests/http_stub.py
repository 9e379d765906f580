"""A real HTTP server on loopback answering every GET with fixed bytes, in a daemon thread
(stand-ins for upstreams and metrics pages in tests); the caller shuts it down."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def text_server(body: bytes) -> ThreadingHTTPServer:
    """Serving ``body`` to every GET on a free loopback port (``server_address``)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd
