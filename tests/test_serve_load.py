"""`serve` under load and faults at once (tinyspec/serve.py, http_app.py): invariants, never speed.

    streams     24 concurrent streams, a third of the clients leaving mid-stream and a few reading slowly:
                every client that stays gets exactly its solo run's text (greedy and seeded sampled), every
                leaver is counted cancelled, and afterwards the KV pool is empty and no slot is busy
    flood       200 refused bodies (413 from Content-Length, 400 while encoding at the context): each one a
                well-formed HTTP reply with a JSON error body, and the RSS where it was
    stop        a request with 4 stop strings of MAX_STOP_CHARS that never match, beside a short one: both exact
    SIGTERM     `serve` killed with streams and whole answers in flight: it exits 0 and every client has a
                well-formed reply (a stream ending with an error event and [DONE], a JSON answer, or a 503)

What these cost in time is measured by tools/serve_faults.py, not asserted here: a busy CI machine would break
a timing assert. The servers run in this process on a free loopback port (port 0) over the shipped tiny model
and the numpy oracle; every client call has a timeout, so a bug cannot hang the suite.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import tinyspec
from tinyspec.generate import generate
from tinyspec.mtp import MTPDrafter
from tinyspec.sampling import SamplingParams
from tinyspec.scheduler import EngineOptions

pytest.importorskip("uvicorn")
from serve_helpers import TIMEOUT, get, rss_mb, shown, target, wait_idle

from tinyspec.serve import Server  # after the skip: the serve extra
from tinyspec.textstream import MAX_STOP_CHARS

K = 3  # the server's draft length (the batch engine's default with MTP)
CTX = 1024  # a smaller context than the model's, so a prompt refused at encode costs less


@functools.cache
def solo(prompt: str, max_new: int, temperature: float = 0.0, seed: int = 0) -> str:
    """The text `generate --spec mtp --draft-n 3 --seed S --temperature T` gives this prompt alone (greedy:
    plain), without the end-of-generation token (as a response shows it)."""
    model, tok = target()
    drafter = MTPDrafter(model) if temperature > 0 else None
    result = generate(model, tok.encode(prompt), max_new, SamplingParams(temperature), np.random.default_rng(seed),
                      stop_ids=tok.eog_ids, drafter=drafter, draft_n=K if drafter else None)
    return shown(result.tokens)


@pytest.fixture(scope="module")
def server():
    """As the faults were reported: 4 slots, MTP, the prefix cache, no chunking (a smaller context)."""
    model, tok = target()
    srv = Server(model, tok, "tiny-target", EngineOptions(slots=4, chunk=None, prefix_cache=True),
                 drafter=MTPDrafter(model), spec="mtp", ctx=CTX, port=0).start()
    assert srv.engine.k_max == K
    yield srv
    srv.close()


def send(host: str, port: int, body: dict) -> socket.socket:
    """A POST /v1/completions on a raw socket (so that the client can leave at any byte)."""
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, port), timeout=TIMEOUT)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                 + str(len(data)).encode() + b"\r\n\r\n" + data)
    return sock


def read_all(sock: socket.socket, pause_s: float = 0.0) -> bytes:
    """Every byte until the server closes, or until one whole reply is in (pause_s: a slow reader's sleep
    between reads)."""
    reply = b""
    try:
        while more := sock.recv(4096):
            reply += more
            if reply_complete(reply):
                break
            time.sleep(pause_s)
    except OSError:  # reset: what came before it is the reply
        pass
    return reply


def reply_complete(reply: bytes) -> bool:
    head, sep, body = reply.partition(b"\r\n\r\n")
    length = re.search(rb"(?i)\r\ncontent-length: (\d+)", head)
    if not sep:
        return False
    if length is not None:
        return len(body) >= int(length.group(1))
    return body.endswith(b"0\r\n\r\n")  # chunked: the last chunk


def parse_reply(reply: bytes) -> tuple[int, str | None, object]:
    """(status, kind, payload) of a well-formed HTTP/1.1 reply, kind "json" (payload: the body) or "stream"
    (payload: the list of its data: events, [DONE] as the string); (-1, None, reason) if it is not one."""
    head, sep, body = reply.partition(b"\r\n\r\n")
    m = re.match(rb"HTTP/1\.1 (\d{3}) ", head)
    if m is None or not sep:
        return -1, None, f"no status line and headers: {reply[:80]!r}"
    status, headers = int(m.group(1)), head.lower()
    if b"transfer-encoding: chunked" in headers:
        data, rest = b"", body
        while True:
            size_line, _, rest = rest.partition(b"\r\n")
            try:
                size = int(size_line, 16)
            except ValueError:
                return -1, None, f"a broken chunk: {size_line[:40]!r}"
            if size == 0:
                break
            if len(rest) < size + 2:
                return -1, None, "the reply ends inside a chunk"
            data, rest = data + rest[:size], rest[size + 2:]
        body = data
    else:
        length = re.search(rb"\r\ncontent-length: (\d+)", headers)
        if length is None or len(body) != int(length.group(1)):
            return -1, None, "a body shorter or longer than its Content-Length"
    if b"content-type: text/event-stream" in headers:
        events = [line[6:] for line in body.decode().split("\n\n") if line.startswith("data: ")]
        return status, "stream", [e if e == "[DONE]" else json.loads(e) for e in events]
    try:
        return status, "json", json.loads(body)
    except ValueError:
        return -1, None, f"a body that is not JSON: {body[:80]!r}"


def stream_text(events: list) -> tuple[str, str | None]:
    """A completion stream's text and its finish_reason."""
    chunks = [e for e in events if e != "[DONE]" and e.get("choices")]
    return "".join(c["choices"][0]["text"] for c in chunks), chunks[-1]["choices"][0]["finish_reason"]


# ------------------------------------------------------------------------------------------ streams

PROMPTS = ("def main(", "import os\n", "class Foo:", "for i in range(", "def f(x):", "import numpy as np\n")


def test_24_streams_with_leavers_and_slow_readers_are_each_exact_and_the_leavers_free_their_slots(server):
    """A third of the clients read two events and close their socket mid-answer (200 tokens asked); three
    read an event every 0.1 s. The others get exactly their solo text, whatever joined or left the passes they
    shared; each leaver is counted cancelled once, and at the end no KV block is held and no slot is busy."""
    wait_idle(server)
    before = get(server, "/v1/stats")
    clients = []  # (kind, prompt, temperature, seed)
    for i in range(24):
        prompt, temperature, seed = PROMPTS[i % len(PROMPTS)], (0.0 if i % 2 else 0.8), i % 5
        clients.append(("leaver" if i % 3 == 0 else "slow" if i in (1, 5, 7) else "stays", prompt, temperature,
                        seed))
    expected = {(p, t, s): solo(p, 16, t, s) for kind, p, t, s in clients if kind != "leaver"}
    replies: list = [None] * len(clients)

    def one(i: int) -> None:
        kind, prompt, temperature, seed = clients[i]
        max_tokens = 200 if kind == "leaver" else 16
        sock = send(server.host, server.port, {"prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
                                               "seed": seed, "stream": True})
        with sock:
            if kind == "leaver":
                seen = b""
                while seen.count(b"data: ") < 2 and (more := sock.recv(4096)):
                    seen += more
                replies[i] = seen
                return
            replies[i] = read_all(sock, 0.1 if kind == "slow" else 0.0)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT * 2)
    assert not any(t.is_alive() for t in threads)
    for (kind, prompt, temperature, seed), reply in zip(clients, replies):
        if kind == "leaver":
            assert reply.count(b"data: ") >= 2, reply  # it left mid-stream, not before or after
            continue
        status, what, events = parse_reply(reply)
        assert status == 200 and what == "stream" and events[-1] == "[DONE]", (status, events)
        assert stream_text(events)[0] == expected[prompt, temperature, seed], (kind, prompt, temperature, seed)
    health = wait_idle(server)
    after = get(server, "/v1/stats")
    n_leavers = sum(kind == "leaver" for kind, *_ in clients)
    assert after["cancelled"] - before["cancelled"] == n_leavers
    assert after["requests"] - before["requests"] == len(clients) - n_leavers
    assert server.engine.pool.used == 0
    assert health["status"] == "ok" and health["slots_busy"] == 0 and health["waiting"] == 0


# ------------------------------------------------------------------------------------------ flood

@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the RSS from /proc")
def test_a_flood_of_refused_bodies_gets_a_json_error_each_and_leaves_the_rss_where_it_was(server):
    """200 refused requests from 4 threads at once: 150 declare a body over max_body (413 from the headers,
    the body never sent), 50 send a prompt just under the byte check, of distinct words, refused while it is
    encoded (400 at the context). Each gets a status line and a JSON error body; the RSS stays within 50 MB."""
    _, tok = target()
    n_bytes = server.ctx * tok.max_token_bytes - 1000
    words = b" ".join(b"w%xz" % i for i in range(n_bytes // 7))[:n_bytes]
    too_big = server.limits.max_body + 1
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    statuses: list = [None] * 200
    jobs, lock = iter(range(len(statuses))), threading.Lock()

    def refused(i: int) -> tuple[int, object]:
        if i % 4 == 3:
            text = words.replace(b"z", b"q%x" % i)[:n_bytes]  # distinct words: nothing from the cache
            data = b'{"prompt": "' + text + b'", "max_tokens": 1}'
            request = head + b"Content-Length: %d\r\n\r\n" % len(data) + data
        else:
            request = head + b"Content-Length: %d\r\n\r\n" % too_big + b'{"prompt": "' + b"x" * 1000
        with socket.create_connection((server.host, server.port), timeout=TIMEOUT) as sock:
            sock.sendall(request)
            status, what, body = parse_reply(read_all(sock))
        return (status if what == "json" and "message" in body.get("error", {}) else -1), body

    def worker() -> None:
        while True:
            with lock:
                i = next(jobs, None)
            if i is None:
                return
            statuses[i] = refused(i)

    wait_idle(server)
    before = rss_mb()
    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT * 2)
    assert [s for s, _ in statuses].count(413) == 150, statuses
    assert [s for s, _ in statuses].count(400) == 50, statuses
    assert all("context" in body["error"]["message"] for s, body in statuses if s == 400)
    assert rss_mb() - before < 50
    sock = send(server.host, server.port, {"prompt": "def main(", "max_tokens": 8, "temperature": 0})
    with sock:
        status, _, body = parse_reply(read_all(sock))
    assert status == 200 and body["choices"][0]["text"] == solo("def main(", 8)


# ------------------------------------------------------------------------------------------ stop strings

def test_long_stop_strings_that_never_match_beside_a_short_request_leave_both_exact(server):
    """4 stop strings of MAX_STOP_CHARS characters each (symbols the tiny model never writes): the request runs
    to its max_tokens with its solo text, streamed and whole; a short request beside it gets its own."""
    stops = [chr(0x2600 + i) * MAX_STOP_CHARS for i in range(4)]
    long_sock = send(server.host, server.port, {"prompt": "import os\n", "max_tokens": 120, "temperature": 0,
                                                "stop": stops, "stream": True})
    whole_sock = send(server.host, server.port, {"prompt": "class Foo:", "max_tokens": 60, "temperature": 0.8,
                                                 "seed": 4, "stop": stops})
    short_sock = send(server.host, server.port, {"prompt": "def main(", "max_tokens": 12, "temperature": 0})
    with long_sock, whole_sock, short_sock:
        short = parse_reply(read_all(short_sock))
        whole = parse_reply(read_all(whole_sock))
        long = parse_reply(read_all(long_sock))
    assert short[0] == 200 and short[2]["choices"][0]["text"] == solo("def main(", 12)
    assert whole[0] == 200 and whole[2]["choices"][0]["text"] == solo("class Foo:", 60, 0.8, 4)
    assert long[0] == 200 and long[2][-1] == "[DONE]"
    assert stream_text(long[2]) == (solo("import os\n", 120), "length")


# ------------------------------------------------------------------------------------------ SIGTERM

def test_sigterm_under_load_exits_0_and_every_client_gets_a_well_formed_reply():
    """`kill` (SIGTERM) while 2 slots run and more wait (8 requests of 250 and 1000 tokens), streamed and whole: the process exits 0, and each
    client has a whole reply: a 200 stream ending with an error event and `data: [DONE]`, a complete JSON
    answer, or a 503 JSON error. Not one is cut off or left without an answer."""
    env = os.environ | {"PYTHONPATH": str(Path(tinyspec.__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "tinyspec", "serve", "--port", "0", "--backend", "numpy",
                             "--slots", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    socks = []
    try:
        line = proc.stdout.readline()  # "tinyspec serve: listening on http://127.0.0.1:PORT (...)"
        assert "listening on http://127.0.0.1:" in line, line + proc.stderr.read()
        port = int(line.split("http://127.0.0.1:")[1].split()[0])
        for i in range(8):  # long ones hold at most slots - 1 slots (fair admission): short ones take the other
            socks.append(send("127.0.0.1", port, {"prompt": PROMPTS[i % len(PROMPTS)], "temperature": 0,
                                                  "max_tokens": 1000 if i % 4 < 2 else 250, "stream": i % 2 == 0}))
        t_end, seen = time.monotonic() + TIMEOUT, []
        while (h := get(SimpleNamespace(host="127.0.0.1", port=port), "/health"))["slots_busy"] < 2 or h["waiting"] < 1:
            seen.append(h)
            assert time.monotonic() < t_end, seen[-20:]
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        replies = [read_all(s) for s in socks]
        assert proc.wait(TIMEOUT) == 0
        assert "stopped" in proc.stdout.read()
    finally:
        for s in socks:
            s.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    outcomes = []
    for reply in replies:
        status, what, payload = parse_reply(reply)
        if what == "stream" and status == 200 and payload[-1] == "[DONE]" and "error" in payload[-2]:
            outcomes.append("stream ended by an error event")
        elif what == "json" and status == 200 and payload["choices"][0]["finish_reason"]:
            outcomes.append("whole answer")
        elif what == "json" and status == 503 and "shutting down" in payload["error"]["message"]:
            outcomes.append("503")
        else:
            outcomes.append(f"not well-formed: {status} {what} {str(payload)[:200]}")
    assert all(not o.startswith("not") for o in outcomes), outcomes
    assert "503" in outcomes, outcomes  # at least one was still waiting for a slot: the shutdown answered it
