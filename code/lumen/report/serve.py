"""`lumen serve`: the explorer page (lumen.report.explore) served on this machine only, with a text box to
explore new prompts. The model is loaded once; each request computes a new page. A bad request (an empty
prompt, a contrast that is not one token, prompts of different lengths) gets the page back with the error
shown in it, and the server carries on.

    >>> server = make_server(model, tok, port=0)              # doctest: +SKIP
    >>> server.serve_forever()                                # doctest: +SKIP

Standard library only (http.server): no web framework. One request computes at a time (the model is shared).

What a hostile page or client can send is bounded: a request addressed to any host but this machine's loopback
name or address is refused (a web page that rebinds its own domain to 127.0.0.1 cannot use the server); at
most MAX_CLIENTS connections are served at once and the next ones are answered 503 with Retry-After at once,
so a burst holds a bounded number of threads; a client that sends nothing for REQUEST_SECONDS is dropped; a
query longer than MAX_QUERY or with more than MAX_FIELDS fields is refused; a client that hangs up mid-page
costs nothing but its own page.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from ..errors import LumenError, UserError
from ..model import GPT
from .explore import explore_data, explore_page

HOST = "127.0.0.1"   # loopback only: the page runs a model for anyone who can reach it
MAX_QUERY = 4096     # bytes of query string accepted
MAX_PATCH_TOKENS = 32   # patching costs a forward pass per (layer, position): longer prompts via lumen explore
MAX_FIELDS = 16      # query fields accepted (the form has four)
MAX_CLIENTS = 8      # connections served at once; one computes, the others wait for the model
REQUEST_SECONDS = 10  # a client silent this long is dropped
RETRY_SECONDS = 2    # what a busy answer tells the client to wait
LOOPBACK = ("127.0.0.1", "localhost", "::1")  # the names a request to this machine's server is addressed to


class ExploreServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer that holds the model, its tokenizer and the lock that serialises its use."""

    daemon_threads = True
    request_queue_size = 64  # connections the kernel holds until accepted (5 by default: a burst's next SYNs were
    # dropped and retried a second later, instead of being answered busy at once)

    def __init__(self, model: GPT, tokenizer, port: int = 0, tuned=None, prompt: str = "", quiet: bool = True):
        self.model, self.tokenizer, self.tuned, self.default_prompt, self.quiet = model, tokenizer, tuned, prompt, quiet
        self.lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(MAX_CLIENTS)
        super().__init__((HOST, port), ExploreHandler)

    def process_request(self, request, client_address) -> None:
        """A thread for the connection if one of MAX_CLIENTS slots is free; else 503 now, from this thread."""
        if not self.slots.acquire(blocking=False):
            return self.busy(request)
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def busy(self, request: socket.socket) -> None:
        """Answer 503 with a retry hint and close, spending at most a moment on a client that reads nothing."""
        body = f"lumen serve is busy ({MAX_CLIENTS} requests at once): try again in {RETRY_SECONDS} s\n".encode()
        try:
            request.settimeout(0.5)
            with contextlib.suppress(OSError):
                request.recv(65536)  # (its request line, so that closing does not reset the connection)
            request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nRetry-After: %d\r\nContent-Type: text/plain; "
                            b"charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                            % (RETRY_SECONDS, len(body), body))
        except OSError:
            pass
        finally:
            self.shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        """A client that hung up or went silent is not an error of the server's; anything else is shown."""
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.server_address[1]}/"

    def page(self, query: dict[str, str]) -> tuple[int, str]:
        """(HTTP status, page) for the form's values; an error is shown in the page, never raised."""
        form = {"prompt": query.get("prompt", self.default_prompt), "contrast_a": query.get("contrast_a", ""),
                "contrast_b": query.get("contrast_b", ""), "corrupt": query.get("corrupt", "")}
        a, b = form["contrast_a"], form["contrast_b"]
        try:
            if bool(a) != bool(b):
                raise UserError("give both contrast tokens, or neither")
            if form["corrupt"] and len(self.tokenizer.encode(form["prompt"])) > MAX_PATCH_TOKENS:
                raise UserError(f"the page patches prompts of up to {MAX_PATCH_TOKENS} tokens (each (layer, position) "
                                "is a forward pass): shorten it, or use lumen explore --corrupt")
            with self.lock:
                data = explore_data(self.model, self.tokenizer, form["prompt"], (a, b) if a else None,
                                    form["corrupt"] or None, self.tuned)
            return 200, explore_page(data, form)
        except LumenError as e:
            return 400, explore_page(None, form, str(e))
        except Exception as e:   # lumen's own bug: say so in the page and in the log, and keep serving
            traceback.print_exc()
            return 500, explore_page(None, form, f"internal error ({type(e).__name__}: {e}); please report it")


class ExploreHandler(BaseHTTPRequestHandler):
    server: ExploreServer
    timeout = REQUEST_SECONDS  # (socketserver: the connection's timeout; a silent client is dropped)

    def do_GET(self) -> None:
        hosts = self.headers.get_all("Host") or []
        if len(hosts) != 1 or not is_loopback(hosts[0]):
            return self._send(403, explore_page(None, {}, "this server answers requests addressed to 127.0.0.1 or "
                                                         "localhost only (Host: " + ", ".join(hosts)[:80] + ")"))
        url = urlsplit(self.path)
        if url.path not in ("/", "/index.html"):
            return self._send(404, explore_page(None, None, f"no page {url.path!r}: the explorer is at /"))
        if len(url.query) > MAX_QUERY:
            return self._send(414, explore_page(None, {}, f"the request is longer than {MAX_QUERY} bytes"))
        try:
            fields = parse_qs(url.query, keep_blank_values=True, max_num_fields=MAX_FIELDS)
        except ValueError:
            return self._send(400, explore_page(None, {}, f"the request has more than {MAX_FIELDS} fields"))
        self._send(*self.server.page({k: v[0] for k, v in fields.items()}))

    def _send(self, status: int, body: str) -> None:
        raw = body.encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
        except (ConnectionError, TimeoutError):  # the client left before its page: nothing to tell it
            self.close_connection = True

    def log_message(self, format: str, *args) -> None:
        if not self.server.quiet:
            super().log_message(format, *args)


def is_loopback(host: str) -> bool:
    """Whether a Host header names this machine's loopback (with any port): 127.0.0.1, localhost, [::1]."""
    host = host.strip().lower()
    name = host[1:host.index("]")] if host.startswith("[") and "]" in host else host.rsplit(":", 1)[0]
    return name in LOOPBACK


def make_server(model: GPT, tokenizer, port: int = 0, tuned=None, prompt: str = "", quiet: bool = True
                ) -> ExploreServer:
    """A server bound to 127.0.0.1:port (0: a free port, see .url); call serve_forever() to run it and
    shutdown() from another thread to stop it."""
    return ExploreServer(model.eval(), tokenizer, port, tuned, prompt, quiet)
