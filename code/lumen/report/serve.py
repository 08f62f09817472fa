"""`lumen serve`: the explorer page (lumen.report.explore) served on this machine only, with a text box to
explore new prompts. The model is loaded once; each request computes a new page. A bad request (an empty
prompt, a contrast that is not one token, prompts of different lengths) gets the page back with the error
shown in it, and the server carries on.

    >>> server = make_server(model, tok, port=0)              # doctest: +SKIP
    >>> server.serve_forever()                                # doctest: +SKIP

Standard library only (http.server): no web framework. One request computes at a time (the model is shared).
"""

from __future__ import annotations

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


class ExploreServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer that holds the model, its tokenizer and the lock that serialises its use."""

    daemon_threads = True

    def __init__(self, model: GPT, tokenizer, port: int = 0, tuned=None, prompt: str = "", quiet: bool = True):
        self.model, self.tokenizer, self.tuned, self.default_prompt, self.quiet = model, tokenizer, tuned, prompt, quiet
        self.lock = threading.Lock()
        super().__init__((HOST, port), ExploreHandler)

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

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path not in ("/", "/index.html"):
            return self._send(404, explore_page(None, None, f"no page {url.path!r}: the explorer is at /"))
        if len(url.query) > MAX_QUERY:
            return self._send(414, explore_page(None, {}, f"the request is longer than {MAX_QUERY} bytes"))
        query = {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        self._send(*self.server.page(query))

    def _send(self, status: int, body: str) -> None:
        raw = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, format: str, *args) -> None:
        if not self.server.quiet:
            super().log_message(format, *args)


def make_server(model: GPT, tokenizer, port: int = 0, tuned=None, prompt: str = "", quiet: bool = True
                ) -> ExploreServer:
    """A server bound to 127.0.0.1:port (0: a free port, see .url); call serve_forever() to run it and
    shutdown() from another thread to stop it."""
    return ExploreServer(model.eval(), tokenizer, port, tuned, prompt, quiet)
