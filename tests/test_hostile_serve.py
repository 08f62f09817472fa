"""`lumen serve`'s server under a burst of concurrent bad and good requests on 127.0.0.1: every answer is
checked, the busy answers are counted exactly (the page's lock is held while the burst arrives, so which
requests find a free slot is decided, not raced), and the server answers a good request afterwards. Then the
real command (`python -m lumen serve` on a character-level run) under slow and silent clients: clients that
trickle their request head a byte at a time, or connect and send nothing, in numbers past every bound, while
a new client must still get its page within seconds.

The reference for "right" is the HTTP contract each request asks for: a page for a good one (its prompt
shown in it), 403 for a request addressed to another host (DNS rebinding), 414 for an oversized query, 400
for a malformed one, 503 with Retry-After for the requests past the bound; and for a head that never ends,
the connection closed by the server once the head's time is up (its whole time, however the bytes trickle)."""

from __future__ import annotations

import concurrent.futures
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers.runs import tiny_run
from lumen.cli import main
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
    exactly MAX_CLIENTS of the good ones get a slot and wait, every later good one is answered 503 with
    Retry-After at once, the bad ones their own refusal (they need no model); once the model is free, every
    waiting good request gets its own page. Then the server answers the next good request."""
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
            for f in busy:  # answered while the model is still busy
                status, headers, body = f.result(timeout=SECONDS)
                assert status == 503 and headers.get("Retry-After") == str(S.RETRY_SECONDS), (status, headers)
                assert "busy" in body
            assert [f.result(timeout=SECONDS)[0] for f in bad] == [403, 414, 0]
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
    """Clients that leave mid-page, or send half a request and nothing more, hold a connection no longer than
    the head's time: the server closes each silent connection then, and keeps answering."""
    port = server.server_address[1]
    monkeypatch.setattr(server, "head_seconds", 1)
    for _ in range(3):
        request(port, hang_up=True)
    silent = [socket.create_connection(("127.0.0.1", port), timeout=SECONDS) for _ in range(S.MAX_CLIENTS)]
    try:
        start = time.time()
        for s in silent:
            s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # (no blank line: the request never ends)
        dropped = 0
        for s in silent:  # each closed by the server once the head's time is up
            answer = s.recv(65536)  # (socket timeout SECONDS: a connection held open fails the test)
            assert answer == b"", answer[:80]
            dropped += 1
        assert dropped == len(silent) and time.time() - start >= 0.9
    finally:
        for s in silent:
            s.close()
    deadline = time.time() + SECONDS
    while server.arriving:
        assert time.time() < deadline, "silent clients still count as arriving"
        time.sleep(0.01)
    assert request(port)[0] == 200 and server.slots._value == S.MAX_CLIENTS


# ---------------------------------------------------------------------------------------------
# the real command, on a character-level run, under slow and silent clients
HEAD_TIMEOUT = 2.0  # --head-timeout: short, so that a head's time running out is seen within the test
TRICKLE = 0.25      # seconds between a slow client's bytes: far below the head's time, so only a deadline for the
#                     whole head (not one for each read) ever drops it


def lumen(*argv: str) -> subprocess.Popen:
    """The real command: `python -m lumen ARGV` in a new process, this checkout's code first on its path."""
    code = Path(__file__).resolve().parents[1] / "code"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")])}
    env.pop("LUMEN_DEBUG", None)
    return subprocess.Popen([sys.executable, "-m", "lumen", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`lumen serve RUN --port 0 --head-timeout 2` on a tiny character-level run: (its port, its run)."""
    run = tiny_run(tmp_path_factory.mktemp("served")) / "run"
    p = lumen("serve", str(run), "--port", "0", "--head-timeout", str(HEAD_TIMEOUT))
    try:
        ready, _, _ = select.select([p.stdout], [], [], 120)
        line = p.stdout.readline() if ready else ""
        url = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert url, f"lumen serve said {line!r}; {p.stderr.read() if p.poll() is not None else ''}"
        yield int(url.group(1)), run
    finally:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def timed_request(port: int, query: str = "prompt=the+sun") -> tuple[int, float, str]:
    """(status, seconds to the answer, body) of one good request."""
    start = time.monotonic()
    status, _, body = request(port, query)
    return status, time.monotonic() - start, body


def trickle(sockets: list[socket.socket], seconds: float) -> dict[socket.socket, float]:
    """Send each socket one byte of a request head that never ends, every TRICKLE seconds, for at most
    `seconds`; the time (from the start) at which the server closed each one."""
    head = b"GET /?prompt=the HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 10000
    start, sent, closed = time.monotonic(), 0, {}
    for s in sockets:
        s.setblocking(False)
    while len(closed) < len(sockets) and time.monotonic() - start < seconds:
        for s in sockets:
            if s not in closed:
                try:
                    s.send(head[sent : sent + 1])
                except OSError:  # (reset or broken pipe: the server closed it)
                    closed[s] = time.monotonic() - start
        sent += 1
        readable, _, _ = select.select([s for s in sockets if s not in closed], [], [], TRICKLE)
        for s in readable:  # readable: the server answered or closed it (EOF, or a reset)
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            assert data == b"", f"a head that never ended was answered: {data[:80]!r}"
            closed[s] = time.monotonic() - start
    return closed


def test_the_first_page_of_a_character_level_run(served):
    """The page `lumen serve` links to answers 200 for a run whose character vocabulary lacks the default
    prompt's letters (it answered its own first page 400): the form alone, no error; a prompt of the run's
    characters gets the full page (the tokens of the prompt in it)."""
    port, _ = served
    status, _, body = request(port, "")
    assert status == 200 and "<form" in body and "id='error'" not in body, (status, body[-300:])
    status, _, body = request(port, "prompt=the+sun")
    assert status == 200 and "id='data'" in body and '"prompt":"the sun"' in body, (status, body[-300:])


def test_a_prompt_the_run_cannot_encode_is_refused_at_the_start(served, capsys):
    """--prompt given with a character the run's vocabulary lacks: one line naming --prompt, exit 2, before any
    server starts (not a first page that is an error). (In this process, as the `lumen` script runs it; an alarm
    ends a server that starts anyway.)"""
    _, run = served

    def alarm(signum, frame):
        raise TimeoutError("lumen serve started serving a first page it cannot show")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(30)
    try:
        rc = main(["serve", str(run), "--prompt", "Zebra", "--port", "0"])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2 and not out, (rc, out)
    assert len(lines) == 1 and lines[0].startswith("lumen serve: error: --prompt 'Zebra': character 'Z'"), lines


def test_slow_header_clients_are_dropped_at_the_heads_deadline(served):
    """MAX_CLIENTS clients trickle a request head a byte every TRICKLE seconds: a new client still gets its
    page at once (it got 503 for as long as they trickled), and each slow one is closed when the head's whole
    time is up (a timeout for each read never fires: bytes keep coming)."""
    port, _ = served
    slow = [socket.create_connection(("127.0.0.1", port), timeout=SECONDS) for _ in range(S.MAX_CLIENTS)]
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            dropped = pool.submit(trickle, slow, HEAD_TIMEOUT + 8)
            time.sleep(4 * TRICKLE)  # (each slow client has sent a few bytes and holds its connection)
            status, seconds, _ = timed_request(port)
            closed = dropped.result(timeout=SECONDS + 10)
    finally:
        for s in slow:
            s.close()
    assert status == 200 and seconds < 5, (status, seconds)
    assert len(closed) == len(slow), f"{len(slow) - len(closed)} slow client(s) still open after {HEAD_TIMEOUT + 8} s"
    assert all(HEAD_TIMEOUT - 0.5 <= t <= HEAD_TIMEOUT + 4 for t in closed.values()), sorted(closed.values())


def test_a_new_client_is_served_while_slow_and_silent_ones_crowd_the_server(served):
    """MAX_CLIENTS slow clients trickle and 100 silent ones connect and send nothing (more than every bound:
    MAX_ARRIVING, MAX_CLIENTS): a new client's request is answered 200 within seconds, twice; the server drops
    the oldest crowd to make room and closes the rest when their head's time is up."""
    port, _ = served
    slow = [socket.create_connection(("127.0.0.1", port), timeout=SECONDS) for _ in range(S.MAX_CLIENTS)]
    silent: list[socket.socket] = []
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            dropped = pool.submit(trickle, slow, HEAD_TIMEOUT + 8)
            silent = [socket.create_connection(("127.0.0.1", port), timeout=SECONDS) for _ in range(100)]
            answers = [timed_request(port) for _ in range(2)]
            closed = dropped.result(timeout=SECONDS + 10)
        end = time.monotonic() + HEAD_TIMEOUT + 4  # (one bound for them all)
        still_open = [s for s in silent if not closed_by_server(s, max(0.01, end - time.monotonic()))]
    finally:
        for s in slow + silent:
            s.close()
    assert all(status == 200 and seconds < 5 for status, seconds, _ in answers), [a[:2] for a in answers]
    assert len(closed) == len(slow) and not still_open, (len(closed), len(still_open))


def closed_by_server(s: socket.socket, seconds: float) -> bool:
    """Whether the server closes the connection (with no answer) within `seconds`."""
    s.settimeout(seconds)
    try:
        return s.recv(65536) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
