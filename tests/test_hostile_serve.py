"""`lumen serve`'s server under a burst of concurrent bad and good requests on 127.0.0.1: every answer is
checked, the busy answers are counted exactly (the page's lock is held while the burst arrives, so which
requests find a free slot is decided, not raced), and the server answers a good request afterwards.

The reference for "right" is the HTTP contract each request asks for: a page for a good one (its prompt
shown in it), 403 for a request addressed to another host (DNS rebinding), 414 for an oversized query, 400
for a malformed one, 503 with Retry-After for the requests past the bound."""

from __future__ import annotations

import concurrent.futures
import re
import socket
import threading
import time

import pytest

from lumen.config import ModelConfig
from lumen.model import GPT
from lumen.report import serve as S
from lumen.tokenizers import CharTokenizer

SECONDS = 20  # the whole burst's bound


@pytest.fixture(scope="module")
def server():
    tok = CharTokenizer.from_text("abcdefghijklmnopqrstuvwxyz .,")
    model = GPT(ModelConfig.from_name("baby-gpt").replace(vocab_size=tok.vocab_size, context=32, d_model=16,
                                                          n_layers=1, n_heads=2)).eval()
    srv = S.make_server(model, tok, port=0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def request(port: int, query: str = "prompt=the+cat", host: str = "127.0.0.1", raw: bytes | None = None,
            hang_up: bool = False) -> tuple[int, dict[str, str], str]:
    """(status, headers, body) of one request (status 0: closed without an answer)."""
    data = raw or f"GET /?{query} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", port), timeout=SECONDS) as s:
        s.sendall(data)
        if hang_up:
            return 0, {}, ""
        s.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    m = re.match(rb"HTTP/1\.[01] (\d{3})", head)
    headers = dict(line.split(": ", 1) for line in head.decode("latin-1").split("\r\n")[1:] if ": " in line)
    return (int(m.group(1)) if m else 0), headers, body.decode("utf-8", "replace")


def test_host_header_must_name_the_loopback(server):
    port = server.server_address[1]
    for host in ("127.0.0.1", f"127.0.0.1:{port}", "localhost", f"LOCALHOST:{port}", f"[::1]:{port}"):
        assert request(port, host=host)[0] == 200, host
    for host in ("evil.example", f"attacker.test:{port}", "127.0.0.1.nip.io", "localhost.evil", "0.0.0.0", ""):
        status, _, body = request(port, host=host)
        assert status == 403 and "127.0.0.1 or localhost only" in body, host
    twice = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n\r\n"
    assert request(port, raw=twice)[0] == 403
    assert request(port, raw=b"GET / HTTP/1.0\r\n\r\n")[0] == 403  # no Host at all


def test_malformed_and_oversized_queries(server):
    port = server.server_address[1]
    assert request(port, "prompt=" + "a" * (S.MAX_QUERY + 1))[0] == 414
    assert request(port, "&".join(f"k{i}=v" for i in range(S.MAX_FIELDS + 1)))[0] == 400
    status, _, body = request(port, "prompt=%ZZ%E9%00the")  # bad escapes decode to replacement characters
    assert status in (200, 400) and "internal error" not in body
    assert request(port, "prompt=the&contrast_a=a")[0] == 400  # one contrast token of two
    assert request(port, raw=b"\x16\x03\x01\x00\xff" + bytes(range(256)))[0] in (0, 400)  # not HTTP (a TLS hello)


def test_a_burst_of_concurrent_requests_is_answered_within_the_bound(server):
    """MAX_CLIENTS + 4 good requests arrive while the model is busy (its lock held), with bad ones among them:
    exactly MAX_CLIENTS of the connections get a slot and wait, every later one (good, bad, or hanging up) is
    answered 503 with Retry-After at once, without a thread; once the model is free, every waiting good request
    gets its own page. Then the server answers the next good request."""
    port = server.server_address[1]
    n = S.MAX_CLIENTS
    server.lock.acquire()
    results: list = []
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=n + 8) as pool:
            good = []
            for i in range(n):  # one at a time until each holds a slot (so the count is exact, not a race)
                good.append(pool.submit(request, port, f"prompt=the+{'abcdefgh'[i]}"))
                deadline = time.time() + SECONDS
                while server.slots._value != n - 1 - i:  # (BoundedSemaphore's count of free slots)
                    assert time.time() < deadline, "a request did not take its slot"
                    time.sleep(0.01)
            busy = [pool.submit(request, port) for _ in range(4)]
            bad = [pool.submit(request, port, host="evil.example"),
                   pool.submit(request, port, "prompt=" + "a" * 9000),
                   pool.submit(request, port, hang_up=True)]
            for f in busy + bad[:2]:  # answered while the model is still busy
                status, headers, _ = f.result(timeout=SECONDS)
                assert status == 503 and headers.get("Retry-After") == str(S.RETRY_SECONDS), (status, headers)
            bad[2].result(timeout=SECONDS)
            server.lock.release()
            results = [f.result(timeout=SECONDS) for f in good]
    finally:
        if server.lock.locked():
            server.lock.release()
    for i, (status, _, body) in enumerate(results):
        assert status == 200 and f"the {'abcdefgh'[i]}" in body, (i, status)
    deadline = time.time() + SECONDS
    while server.slots._value != n:  # every handler thread has finished and given its slot back
        assert time.time() < deadline, "slots were not given back"
        time.sleep(0.01)
    assert request(port)[0] == 200


def test_clients_that_hang_up_or_go_silent(server, monkeypatch):
    """Clients that leave mid-page, or send half a request and nothing more, hold a slot no longer than the
    handler's timeout: the server closes each silent connection then, and keeps answering."""
    port = server.server_address[1]
    monkeypatch.setattr(S.ExploreHandler, "timeout", 1)
    for _ in range(3):
        request(port, hang_up=True)
    silent = [socket.create_connection(("127.0.0.1", port), timeout=SECONDS) for _ in range(S.MAX_CLIENTS)]
    try:
        start = time.time()
        for s in silent:
            s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # (no blank line: the request never ends)
        dropped = 0
        for s in silent:  # each closed by the server after the handler's timeout (or, had it no slot, busy)
            answer = s.recv(65536)  # (socket timeout SECONDS: a connection held open fails the test)
            assert answer == b"" or answer.startswith(b"HTTP/1.0 503"), answer[:80]
            dropped += answer == b""
        assert dropped and time.time() - start >= 1
    finally:
        for s in silent:
            s.close()
    deadline = time.time() + SECONDS
    while server.slots._value != S.MAX_CLIENTS:
        assert time.time() < deadline, "silent clients held their slots"
        time.sleep(0.01)
    assert request(port)[0] == 200
