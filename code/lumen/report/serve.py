"""`lumen serve`: the explorer page (lumen.report.explore) served on this machine only, with a text box to
explore new prompts. The model is loaded once; each request computes a new page. A bad request (an empty
prompt, a contrast that is not one token, prompts of different lengths) gets the page back with the error
shown in it, and the server carries on.

    >>> server = make_server(model, tok, port=0)              # doctest: +SKIP
    >>> server.serve_forever()                                # doctest: +SKIP

Standard library only (http.server): no web framework. One request computes at a time (the model is shared).

What a hostile page or client can send is bounded: a request addressed to any host but this machine's loopback
name or address is refused (a web page that rebinds its own domain to 127.0.0.1 cannot use the server); a
query longer than MAX_QUERY or with more than MAX_FIELDS fields is refused; a client that hangs up mid-page
costs nothing but its own page. Slow and silent clients cannot crowd out the others:

- a connection has HEAD_SECONDS in all to send its request line and headers, however it trickles them (a
  deadline for the whole head, not for each read: a client sending a byte a second is dropped at it too);
- at most MAX_ARRIVING connections may be sending their head at once: a new one past them drops the one that
  has been sending longest (a real client sends its head in one packet, so the dropped one is a slow one);
- at most MAX_CLIENTS requests wait for the model; the next ones are answered 503 with Retry-After at once.
So the threads are bounded, and a new client is answered while any number of slow ones trickle.
"""

from __future__ import annotations

import contextlib
import io
import socket
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from ..errors import LumenError, UserError
from ..model import GPT
from .explore import MAX_TOKENS, explore_data, explore_page

HOST = "127.0.0.1"   # loopback only: the page runs a model for anyone who can reach it
MAX_QUERY = 4096     # bytes of query string accepted
MAX_PATCH_TOKENS = 32   # patching costs a forward pass per (layer, position): longer prompts via lumen explore
MAX_FIELDS = 16      # query fields accepted (the form has four)
MAX_CLIENTS = 8      # requests waiting for the model at once (one computes, the others queue for it)
MAX_ARRIVING = 32    # connections still sending their request head at once
HEAD_SECONDS = 10.0  # the time a connection has to send its whole request head
SEND_SECONDS = 10.0  # the time a client has to take its page
RETRY_SECONDS = 2    # what a busy answer tells the client to wait
LOOPBACK = ("127.0.0.1", "localhost", "::1")  # the names a request to this machine's server is addressed to
DEFAULT_PROMPT = "The Eiffel Tower is in the city of"


class ExploreServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer that holds the model, its tokenizer and the lock that serialises its use, and
    bounds the connections still sending their head (`arriving`) and the requests waiting for the model."""

    daemon_threads = True
    block_on_close = False  # (closing does not wait for clients still trickling: their threads are daemons)
    request_queue_size = 256  # connections the kernel holds until accepted (5 by default: a burst's next SYNs were
    # dropped and retried a second later, instead of being answered at once)

    def __init__(self, model: GPT, tokenizer, port: int = 0, tuned=None, prompt: str = "", quiet: bool = True,
                 head_seconds: float = HEAD_SECONDS):
        self.model, self.tokenizer, self.tuned, self.default_prompt, self.quiet = model, tokenizer, tuned, prompt, quiet
        self.head_seconds = head_seconds
        self.lock = threading.Lock()  # the model: one page computes at a time
        self.slots = threading.BoundedSemaphore(MAX_CLIENTS)  # requests waiting for the model
        self.arriving: dict[socket.socket, bool] = {}  # connections sending their head, oldest first
        self.arriving_lock = threading.Lock()
        super().__init__((HOST, port), ExploreHandler)

    def process_request(self, request, client_address) -> None:
        """A thread for the connection, after making room for it among the MAX_ARRIVING that may be sending
        their head: the one that has been sending longest is dropped."""
        with self.arriving_lock:
            if len(self.arriving) >= MAX_ARRIVING:
                oldest = next(iter(self.arriving))
                del self.arriving[oldest]
                with contextlib.suppress(OSError):  # (its thread's read ends; its thread closes it)
                    oldest.shutdown(socket.SHUT_RDWR)
            self.arriving[request] = True
        super().process_request(request, client_address)

    def arrived(self, request: socket.socket) -> bool:
        """The connection's head is in: it no longer counts as arriving (False: it was dropped meanwhile)."""
        with self.arriving_lock:
            return self.arriving.pop(request, False)

    def shutdown_request(self, request) -> None:
        self.arrived(request)  # (a connection that ends before its head is in: timed out, dropped, malformed)
        super().shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        """A client that hung up, went silent or was dropped is not an error of the server's; anything else is
        shown."""
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
        if not query and not self.default_prompt:  # no prompt this model can show was given: the form alone
            return 200, explore_page(None, form)
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
    timeout = SEND_SECONDS  # (socketserver: the connection's timeout; sendall's bound for a whole page)

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # (the plain reader: a deadline for each read, not for the head)
        self.rfile = io.BufferedReader(HeadReader(self.connection, time.monotonic() + self.server.head_seconds))

    def parse_request(self) -> bool:
        """The request line and headers, read before the head's deadline; from here on the request no longer
        counts as arriving."""
        ok = super().parse_request()
        if not self.server.arrived(self.connection):  # dropped to make room just as its head came in
            self.close_connection = True
            return False
        self.connection.settimeout(SEND_SECONDS)
        return ok

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
        query = {k: v[0] for k, v in fields.items()}
        if not self.server.slots.acquire(blocking=False):  # MAX_CLIENTS wait for the model already
            return self._send(503, explore_page(None, query, f"lumen serve is busy ({MAX_CLIENTS} requests wait for "
                                                             f"the model): try again in {RETRY_SECONDS} s"),
                              {"Retry-After": str(RETRY_SECONDS)})
        try:
            self._send(*self.server.page(query))
        finally:
            self.server.slots.release()

    def _send(self, status: int, body: str, headers: dict[str, str] | None = None) -> None:
        raw = body.encode("utf-8")
        try:
            self.send_response(status)
            for key, value in {"Content-Type": "text/html; charset=utf-8", "Content-Length": str(len(raw)),
                               **(headers or {})}.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(raw)
        except (ConnectionError, TimeoutError):  # the client left before its page: nothing to tell it
            self.close_connection = True

    def log_message(self, format: str, *args) -> None:
        if not self.server.quiet:
            super().log_message(format, *args)


class HeadReader(io.RawIOBase):
    """A connection's bytes, each read waiting only for what is left of the deadline: the whole request head
    must arrive by then, however it trickles (a timeout for each read would let a byte a second go on forever)."""

    def __init__(self, connection: socket.socket, deadline: float):
        self.connection, self.deadline = connection, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request head did not arrive in time")
        self.connection.settimeout(left)
        return self.connection.recv_into(buffer)


def is_loopback(host: str) -> bool:
    """Whether a Host header names this machine's loopback (with any port): 127.0.0.1, localhost, [::1]."""
    host = host.strip().lower()
    name = host[1:host.index("]")] if host.startswith("[") and "]" in host else host.rsplit(":", 1)[0]
    return name in LOOPBACK


def first_prompt(model: GPT, tokenizer, prompt: str | None) -> str:
    """The first page's prompt: `prompt`, refused now if the page cannot show it; none given, DEFAULT_PROMPT if
    the page can show it, else "" (the first page is then the form alone: a character-level model may lack
    DEFAULT_PROMPT's letters, a small model its length)."""
    if prompt is None:
        return "" if unshowable(model, tokenizer, DEFAULT_PROMPT) else DEFAULT_PROMPT
    why = unshowable(model, tokenizer, prompt)
    if why:
        raise UserError(f"--prompt {prompt[:40]!r}: {why}; give a prompt the page can show for this model")
    return prompt


def unshowable(model: GPT, tokenizer, prompt: str) -> str | None:
    """Why the page cannot show `prompt` (None: it can): its text is not in the vocabulary, or its length."""
    try:
        n = len(tokenizer.encode(prompt))
    except LumenError as e:
        return str(e)
    most = min(MAX_TOKENS, model.cfg.context)
    return None if 0 < n <= most else f"it is {n} tokens; the page shows 1 to {most}"


def make_server(model: GPT, tokenizer, port: int = 0, tuned=None, prompt: str = "", quiet: bool = True,
                head_seconds: float = HEAD_SECONDS) -> ExploreServer:
    """A server bound to 127.0.0.1:port (0: a free port, see .url); call serve_forever() to run it and
    shutdown() from another thread to stop it. prompt: the first page's (empty: the form alone); head_seconds:
    the time a connection has to send its request head."""
    return ExploreServer(model.eval(), tokenizer, port, tuned, prompt, quiet, head_seconds)
