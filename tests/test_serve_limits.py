"""`serve` left running where anything can reach it (tinyspec/http_app.py, serve.Limits): each fault found in the
server before it moved to uvicorn + Starlette, as a test that failed then (docs/http-server.md, "Limits").

    one request freezes all   a stop string is bounded (MAX_STOP_CHARS) and matched in linear time
    memory                    refused prompts leave the tokenizer's cache and the RSS where they were; a body
                              over --max-body is refused from its Content-Length, before it is read
    slow and bad clients      header, body and idle deadlines; a connection cap; JSON Content-Type required;
                              a well-formed 4xx for malformed HTTP (HTTP/0.9, a non-ASCII Content-Length, a lone
                              surrogate, a body longer or shorter than its length)
    limits and keys           --api-key (401), --max-tokens, a per-request deadline (504), fair admission (a
                              short request never waits for a long one), unknown model names (404), /health 503
                              when the engine thread is dead or stuck
    output                    a tiny temperature is greedy, not NaN; the end-of-generation token's text is never
                              in the answer; `created` is the response's time; GET on a POST endpoint is a 405
    watching                  /metrics in Prometheus' text format; per-request draft_n

The servers run in this process on a free loopback port, over the shipped tiny model and the numpy oracle.
"""

from __future__ import annotations

import functools
import http.client
import json
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tinyspec.generate import generate
from tinyspec.mtp import MTPDrafter
from tinyspec.openai_api import Ask
from tinyspec.sampling import SamplingParams
from tinyspec.scheduler import EngineOptions

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")
from serve_helpers import rss_mb, shown, target

from tinyspec.serve import Limits, Server  # after the skip: the serve extra
from tinyspec.textstream import MAX_STOP_CHARS

TIMEOUT = 30  # seconds any one client call may take
K = 3


@functools.cache
def greedy(prompt: tuple[int, ...], max_new: int) -> tuple[int, ...]:
    model, tok = target()
    return tuple(generate(model, list(prompt), max_new, SamplingParams(0.0), np.random.default_rng(0),
                          stop_ids=tok.eog_ids).tokens)


def make_server(limits: Limits | None = None, slots: int = 4, spec: bool = True) -> Server:
    model, tok = target()
    limits = limits or Limits()
    return Server(model, tok, "tiny-target", EngineOptions(slots=slots, chunk=None if spec else 16,
                                                           prefix_cache=True),
                  drafter=MTPDrafter(model) if spec else None, spec="mtp" if spec else "none", port=0,
                  limits=limits).start()


@pytest.fixture(scope="module")
def server():
    """As the faults were found: 4 slots, MTP, the prefix cache; the default limits."""
    srv = make_server()
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def strict():
    """Short deadlines and small caps, so that the tests of them take a second."""
    srv = make_server(Limits(api_keys=("sesame",), served_model_names=("tiny-target", "alias"), max_tokens=600,
                             short_tokens=64, request_timeout_s=1.5, max_body=4096, max_connections=6,
                             header_timeout_s=1.0, body_timeout_s=1.0, idle_timeout_s=1.0), slots=2, spec=False)
    yield srv
    srv.close()


KEY = {"Authorization": "Bearer sesame"}


def exchange(srv: Server, method: str, path: str, body=None, headers=None, raw: bytes | None = None,
             timeout: float = TIMEOUT) -> tuple[int, dict, dict]:
    """(status, headers, body: parsed if JSON, else text) of one request on a new connection."""
    conn = http.client.HTTPConnection(srv.host, srv.port, timeout=timeout)
    try:
        data = raw if raw is not None else None if body is None else json.dumps(body)
        conn.request(method, path, data, {"Content-Type": "application/json"} | (headers or {}))
        response = conn.getresponse()
        data = response.read()
        is_json = (response.getheader("content-type") or "").startswith("application/json")
        return response.status, dict(response.getheaders()), json.loads(data) if is_json else data.decode()
    finally:
        conn.close()


def raw_reply(srv: Server, data: bytes, wait_s: float = 10.0) -> bytes:
    """Bytes in; every byte the server sends until it closes the connection (or wait_s passes) out."""
    with socket.create_connection((srv.host, srv.port), timeout=wait_s) as sock:
        sock.sendall(data)
        reply = b""
        try:
            while more := sock.recv(65536):
                reply += more
        except TimeoutError:
            pass
    return reply


def status_of(reply: bytes) -> int:
    assert reply.startswith(b"HTTP/1.1 "), reply[:200]
    return int(reply.split()[1])


def json_of(reply: bytes) -> dict:
    return json.loads(reply.partition(b"\r\n\r\n")[2])


# ------------------------------------------------------------------------------------------ one request freezes all

def test_a_stop_string_longer_than_the_limit_is_refused(server):
    """Before: a 300 KB stop string was taken, and matching it stalled every request 10-29 s."""
    status, _, body = exchange(server, "POST", "/v1/completions",
                               {"prompt": "x", "max_tokens": 4, "stop": "ab" * MAX_STOP_CHARS})
    assert status == 400 and body["error"]["param"] == "stop" and str(MAX_STOP_CHARS) in body["error"]["message"]
    status, _, body = exchange(server, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 4, "temperature": 0,
                                                                   "stop": ["q" * MAX_STOP_CHARS] * 4})
    assert status == 200, body


# ------------------------------------------------------------------------------------------ memory

@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the RSS from /proc")
def test_refused_prompts_leave_the_tokenizer_cache_and_the_rss_where_they_were(server):
    """Before: every word of a refused prompt stayed in the tokenizer's cache; 60 refused 790 KB prompts took the
    RSS from 343 to 733 MB. Each prompt here passes the byte-length check (it could be few enough tokens) and is
    refused while it is encoded, after at most a context's worth of work."""
    _, tok = target()
    server.tokenizer.cache.clear()
    server.tokenizer.cache_chars = 0
    n_bytes = server.ctx * tok.max_token_bytes - 1000  # just under what the byte check refuses
    words = [f"w{i:x}z" for i in range(n_bytes // 9)]
    before = rss_mb()
    for r in range(12):
        prompt = " ".join(f"{w}{r}" for w in words)[:n_bytes]
        status, _, body = exchange(server, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 1})
        assert status == 400 and "context" in body["error"]["message"], body
    assert rss_mb() - before < 50
    assert len(server.tokenizer.cache) <= server.ctx + 100  # what the first context's worth of words left
    status, _, _ = exchange(server, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 2, "temperature": 0})
    assert status == 200


def test_a_body_over_max_body_is_refused_before_it_is_sent(server):
    """Before: bodies up to 16 MB were read and parsed (~10x their size each, any number at once)."""
    too_big = server.limits.max_body + 1
    reply = raw_reply(server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(too_big).encode() + b"\r\n\r\n{\"prompt\": \"")  # the rest never sent
    assert status_of(reply) == 413 and "max-body" in json_of(reply)["error"]["message"]


def test_a_client_uploading_a_huge_body_reads_the_413_not_a_reset(server):
    """http.client (as the openai client) sends the whole body before it reads: the server answers 413 from the
    Content-Length and must keep reading (and dropping) the upload until the client is done. Before: the socket
    closed with unread bytes, which sends a reset, and the client saw ConnectionResetError, not the 413."""
    statuses = []

    def upload() -> None:
        conn = http.client.HTTPConnection(server.host, server.port, timeout=TIMEOUT)
        try:
            conn.request("POST", "/v1/completions", b'{"prompt": "' + b"x" * (30 << 20) + b'"}',
                         {"Content-Type": "application/json"})
            statuses.append(conn.getresponse().status)
        except OSError as e:
            statuses.append(repr(e))
        finally:
            conn.close()

    threads = [threading.Thread(target=upload) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert statuses == [413] * 3


# ------------------------------------------------------------------------------------------ slow and bad clients

def test_malformed_http_gets_a_well_formed_400(server):
    """Before: a Content-Length of non-ASCII digits and a lone surrogate got no reply at all; HTTP/0.9 hung 60 s;
    a malformed request line got a reply with no status line."""
    for data in (b"GET /health\r\n\r\n",  # HTTP/0.9
                 b"NOT A REQUEST LINE HTTP/1.1\r\n\r\n",
                 "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 "Content-Length: \u0661\u0662\r\n\r\n{}".encode()):
        reply = raw_reply(server, data, wait_s=5)
        assert status_of(reply) == 400 and json_of(reply)["error"]["message"], reply
    status, _, body = exchange(server, "POST", "/v1/completions", raw=b'{"prompt": "a\\ud800b"}')
    assert status == 400 and "malformed JSON" in body["error"]["message"]


def test_a_body_longer_than_its_length_is_not_run_as_a_second_request(server):
    """The bytes past Content-Length are the next request on the connection (HTTP/1.1): garbage there gets a
    well-formed 400 and the connection closes."""
    body = b'{"prompt": [1, 2], "max_tokens": 1, "temperature": 0}'
    reply = raw_reply(server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body + b"GARBAGE GARBAGE\r\n\r\n",
                      wait_s=5)
    assert reply.count(b"HTTP/1.1 ") == 2 and status_of(reply) == 200
    assert status_of(reply[reply.index(b"HTTP/1.1 ", 1):]) == 400


def test_a_json_content_type_is_required(server):
    """Before: any Content-Type was read as JSON, so a web page could POST to the server cross-site as text/plain
    (a CORS "simple" request, sent without a preflight)."""
    status, _, body = exchange(server, "POST", "/v1/completions", raw=b'{"prompt": "x"}',
                               headers={"Content-Type": "text/plain"})
    assert status == 415 and "application/json" in body["error"]["message"]


def test_a_slow_client_is_dropped_at_the_header_and_body_deadlines(strict):
    """Before: a connection sending a byte now and then (slowloris) was held forever, a thread each."""
    t0 = time.monotonic()
    with socket.create_connection((strict.host, strict.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        for _ in range(8):  # a byte every 0.25 s: never the end of the headers
            time.sleep(0.25)
            try:
                sock.sendall(b"X")
            except OSError:
                break
        assert sock.recv(100) == b""  # closed by the server
    assert time.monotonic() - t0 < 8
    reply = raw_reply(strict, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Authorization: Bearer sesame\r\nContent-Length: 100\r\n\r\n{\"prompt\"", wait_s=8)
    assert status_of(reply) == 408


def test_connections_past_the_cap_get_a_503(strict):
    socks = [socket.create_connection((strict.host, strict.port), timeout=5) for _ in range(strict.limits.max_connections)]
    try:
        reply = raw_reply(strict, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", wait_s=5)
        assert status_of(reply) == 503 and "connections" in json_of(reply)["error"]["message"]
    finally:
        for s in socks:
            s.close()
    t_end = time.monotonic() + 10
    while exchange(strict, "GET", "/health")[0] != 200:  # the server notices the closed ones
        assert time.monotonic() < t_end
        time.sleep(0.05)


# ------------------------------------------------------------------------------------------ limits and keys

def test_an_api_key_is_asked_on_v1_and_health_stays_open(strict):
    assert exchange(strict, "POST", "/v1/completions", {"prompt": "x"})[0] == 401
    status, headers, body = exchange(strict, "GET", "/v1/models", headers={"Authorization": "Bearer nope"})
    assert status == 401 and headers.get("www-authenticate") == "Bearer" and "API key" in body["error"]["message"]
    assert exchange(strict, "GET", "/health")[0] == 200 and exchange(strict, "GET", "/metrics")[0] == 200
    c = openai.OpenAI(base_url=strict.url + "/v1", api_key="sesame", timeout=TIMEOUT, max_retries=0)
    out = c.completions.create(model="alias", prompt=[1, 2, 3], max_tokens=3, temperature=0)
    assert out.model == "alias" and out.choices[0].text == shown(greedy((1, 2, 3), 3))
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=strict.url + "/v1", api_key="x", max_retries=0).models.list()


def test_unknown_model_names_are_a_404(server, strict):
    """Before: any name was answered by the tiny model, and echoed back."""
    status, _, body = exchange(server, "POST", "/v1/completions", {"model": "gpt-5", "prompt": "x"})
    assert status == 404 and body["error"]["param"] == "model" and "tiny-target" in body["error"]["message"]
    status, _, body = exchange(strict, "GET", "/v1/models", headers=KEY)
    assert [m["id"] for m in body["data"]] == ["tiny-target", "alias"]


def test_max_tokens_is_capped_and_a_chat_without_it_gets_the_cap(strict):
    """Before: no cap; a chat request without max_tokens ran to the end of the context (4,071 tokens)."""
    status, _, body = exchange(strict, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 601}, KEY)
    assert status == 400 and "--max-tokens" in body["error"]["message"]
    status, headers, body = exchange(strict, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 600,
                                                                         "temperature": 0, "stream": True}, KEY)
    assert status == 200 and headers["content-type"].startswith("text/event-stream") and "data: " in body
    events = []
    chat = Ask(True, "<|user|>hi\n<|assistant|>", None, SamplingParams(0.0), None, (), False, False, None)
    job = strict.submit(chat, [1, 2, 3], events.append)  # what /v1/chat/completions hands the engine
    assert job.max_new == strict.limits.max_tokens  # not the rest of the context (4,093)
    strict.cancel(job)


def test_a_request_past_its_deadline_gets_a_504(strict):
    refused_before = exchange(strict, "GET", "/v1/stats", headers=KEY)[2]["refused"]
    status, _, body = exchange(strict, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 600, "temperature": 0.9,
                                                                   "seed": 1}, KEY)
    if status == 200:  # finished inside 1.5 s on a fast machine: nothing to see
        pytest.skip("600 tokens took under 1.5 s here")
    assert status == 504 and "--request-timeout" in body["error"]["message"]
    stats = exchange(strict, "GET", "/v1/stats", headers=KEY)[2]
    assert stats["timed_out"] >= 1 and stats["refused"] == refused_before  # counted once, as what it was


def test_fair_admission_a_short_request_does_not_wait_for_long_ones(strict):
    """Two slots, two long requests (max_tokens above short_tokens): a long one holds at most one slot, so a short
    request that comes after both is answered before either ends. Before: first come, first served: it waited
    for a long one to end (30.8 s behind four 4000-token requests on 4 slots)."""
    order, lock = [], threading.Lock()

    def run(name: str, body: dict) -> None:
        status, _, _ = exchange(strict, "POST", "/v1/completions", body, KEY, timeout=60)
        with lock:
            order.append((name, status))

    long_body = {"prompt": "import os\n", "max_tokens": 500, "temperature": 0}
    threads = [threading.Thread(target=run, args=(f"long{i}", long_body)) for i in range(2)]
    for t in threads:
        t.start()
    t_end = time.monotonic() + TIMEOUT
    while exchange(strict, "GET", "/health")[2]["slots_busy"] + exchange(strict, "GET", "/health")[2]["waiting"] < 2:
        assert time.monotonic() < t_end
        time.sleep(0.01)
    run("short", {"prompt": [1, 2, 3], "max_tokens": 8, "temperature": 0})
    for t in threads:
        t.join(60)
    names = [name for name, _ in order]
    assert names[0] == "short", order  # the longs run 500 tokens each (or hit the 1.5 s deadline: 504)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the engine thread's end
def test_health_is_503_when_the_engine_thread_is_stuck_or_dead():
    srv = make_server(Limits(stuck_after_s=0.3), slots=1, spec=False)
    try:
        release = threading.Event()
        real_step = srv.engine.step

        def stuck_step():
            release.wait(10)
            real_step()
            raise SystemExit  # the engine thread ends: a dead engine

        srv.engine.step = stuck_step
        answers = []
        asker = threading.Thread(target=lambda: answers.append(exchange(srv, "POST", "/v1/completions",
                                                                        {"prompt": "x", "max_tokens": 3})))
        asker.start()
        time.sleep(0.8)
        status, _, body = exchange(srv, "GET", "/health")
        assert status == 503 and body["status"] == "engine stuck"
        release.set()
        srv.engine_thread.join(10)
        status, _, body = exchange(srv, "GET", "/health")
        assert status == 503 and body["status"] == "engine thread stopped"
        asker.join(TIMEOUT)  # the request in flight is answered too, not left hanging
        assert answers[0][0] == 503 and "engine" in answers[0][2]["error"]["message"]
    finally:
        srv.close(grace_s=1)


# ------------------------------------------------------------------------------------------ output

def test_a_tiny_temperature_is_greedy_not_nan(server):
    """Before: temperature 1e-308 divided the logits to inf, the law was NaN, and the answer <|endoftext|>."""
    _, tok = target()
    ids = tuple(tok.encode("def main("))
    status, _, body = exchange(server, "POST", "/v1/completions", {"prompt": list(ids), "max_tokens": 10,
                                                                   "temperature": 1e-308, "seed": 3})
    assert status == 200 and body["choices"][0]["text"] == shown(greedy(ids, 10))


def test_the_end_of_generation_token_is_not_in_the_text(server):
    """Before: `... <|endoftext|>` came back as text (llama-server and vLLM drop it). It still counts as a token."""
    _, tok = target()
    prompt = "import os\nimport sys\n\n\ndef main(argv):\n    parser = make_parser()\n    args = parser.parse_args(argv)\n    return 0\n"
    ids = tuple(tok.encode(prompt))
    expected = greedy(ids, 8)
    assert expected[-1] in tok.eog_ids  # this prompt ends at once
    for stream in (False, True):
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", timeout=TIMEOUT, max_retries=0)
        out = c.completions.create(model="tiny-target", prompt=prompt, max_tokens=8, temperature=0, stream=stream)
        chunks = list(out) if stream else [out]
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        assert "<|endoftext|>" not in text and text == shown(expected)
        assert chunks[-1].choices[0].finish_reason == "stop"


def test_created_is_the_response_time_and_get_on_a_post_endpoint_is_405(server):
    """Before: every response carried the server's start time; GET /v1/completions was a 404."""
    time.sleep(1.1)
    t0 = int(time.time())
    status, _, body = exchange(server, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 1, "temperature": 0})
    assert status == 200 and body["created"] >= t0
    status, _, body = exchange(server, "GET", "/v1/completions")
    assert status == 405 and "GET" in body["error"]["message"]


# ------------------------------------------------------------------------------------------ watching

def test_metrics_are_prometheus_text_and_count_what_happened(server):
    exchange(server, "POST", "/v1/completions", {"prompt": "def f(x):", "max_tokens": 12, "temperature": 0})
    conn = http.client.HTTPConnection(server.host, server.port, timeout=TIMEOUT)
    conn.request("GET", "/metrics")
    response = conn.getresponse()
    text = response.read().decode()
    conn.close()
    assert response.status == 200 and response.getheader("content-type").startswith("text/plain; version=0.0.4")
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    assert samples['tinyspec_requests_total{outcome="requests"}'] >= 1
    assert samples["tinyspec_generation_tokens_total"] >= 12
    assert samples["tinyspec_draft_tokens_total"] >= samples["tinyspec_accepted_tokens_total"] > 0
    assert samples['tinyspec_draft_tokens_at_position_total{position="1"}'] >= \
        samples['tinyspec_accepted_tokens_at_position_total{position="1"}'] > 0
    assert samples['tinyspec_time_to_first_token_seconds_bucket{le="+Inf"}'] == \
        samples["tinyspec_time_to_first_token_seconds_count"] >= 1
    assert {"tinyspec_requests_waiting", "tinyspec_requests_running", "tinyspec_prefix_cache_hits_total",
            "tinyspec_preemptions_total"} <= set(samples)


def test_a_request_may_turn_speculation_off_or_down(server):
    """{"tinyspec": {"draft_n": d}}: at most d drafts a step for this request (0: plain decoding), its tokens
    still those of its solo run."""
    _, tok = target()
    ids = tuple(tok.encode("def main("))
    for d in (0, 1):
        status, _, body = exchange(server, "POST", "/v1/completions", {"prompt": list(ids), "max_tokens": 10,
                                                                       "temperature": 0, "tinyspec": {"draft_n": d}})
        assert status == 200 and body["choices"][0]["text"] == shown(greedy(ids, 10))
        assert body["tinyspec"]["drafted"] <= d * body["tinyspec"]["steps"]
    status, _, body = exchange(server, "POST", "/v1/completions", {"prompt": "x", "tinyspec": {"draft_n": K + 1}})
    assert status == 400 and body["error"]["param"] == "tinyspec"


# ------------------------------------------------------------------------------------------ the CLI

def test_the_cli_refuses_bad_limits_and_unreadable_key_files_before_it_loads(tmp_path, capsys):
    from tinyspec.__main__ import main

    assert main(["serve", "--max-tokens", "0", "--port", "0"]) == 2
    assert "max_tokens must be >= 1" in capsys.readouterr().err
    assert main(["serve", "--api-key-file", str(tmp_path / "none"), "--port", "0"]) == 2
    assert "cannot read --api-key-file" in capsys.readouterr().err
    (tmp_path / "empty").write_text("\n\n")
    assert main(["serve", "--api-key-file", str(tmp_path / "empty"), "--port", "0"]) == 2
    assert "holds no key" in capsys.readouterr().err


def test_refusals_are_paced_so_a_flood_cannot_take_the_loop(server):
    """A client sending bad requests as fast as they are answered is slowed to REFUSALS_PER_S answers a second
    (a lower bound on time, which a busy machine can only lengthen). Before: 413s were answered about 3,800 a
    second to one flooding client, and a 32-token request beside it took 2.5x its time alone (10 s beside four
    such clients; tools/serve_faults.py)."""
    from tinyspec.http_app import REFUSALS_PER_S

    n = 6
    t0 = time.monotonic()
    for _ in range(n):
        assert exchange(server, "POST", "/v1/completions", raw=b'{"prompt": ')[0] == 400
    assert time.monotonic() - t0 >= (n - 1) / REFUSALS_PER_S
    assert server.http.next_refusal >= t0 + n / REFUSALS_PER_S


def test_a_pipelined_request_is_not_cut_by_the_header_deadline():
    """Two requests sent at once on one connection: uvicorn starts the second as the first's response completes.
    Before: the header timer was armed after that, and closed the connection 0.5 s into the second answer."""
    srv = make_server(Limits(header_timeout_s=0.5), slots=1, spec=False)
    try:
        body = b'{"prompt": [1, 2, 3], "max_tokens": 300, "temperature": 0}'
        one = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
               + str(len(body)).encode() + b"\r\n\r\n" + body)
        reply = raw_reply(srv, one + one.replace(b"Host: x", b"Host: x\r\nConnection: close"), wait_s=TIMEOUT)
        assert reply.count(b"HTTP/1.1 200 ") == 2, reply[-300:]
    finally:
        srv.close()


def test_shutdown_answers_every_request_in_flight_with_a_json_503():
    """Refusals are paced, the server's own errors are not: before, 150 jobs ended by close() took 7.5 s to
    answer at 20 a second, past the 5 s grace, and 42 clients got uvicorn's plain-text 500."""
    srv = make_server(slots=1, spec=False)
    answers, lock = [], threading.Lock()

    def ask() -> None:
        try:
            status, _, body = exchange(srv, "POST", "/v1/completions", {"prompt": [1, 2], "max_tokens": 200,
                                                                        "temperature": 0})
        except OSError as e:
            status, body = -1, repr(e)
        with lock:
            answers.append((status, body))

    threads = [threading.Thread(target=ask) for _ in range(120)]
    for t in threads:
        t.start()
    t_end = time.monotonic() + TIMEOUT
    while srv.stats()["waiting"] < 100:
        assert time.monotonic() < t_end
        time.sleep(0.02)
    srv.close()
    for t in threads:
        t.join(TIMEOUT)
    assert len(answers) == 120
    assert all(s == 200 or (s == 503 and "shutting down" in b["error"]["message"]) for s, b in answers), \
        {s for s, _ in answers}
    stats = srv.stats()
    # each 503 counted once: cancelled in flight, or refused if it arrived as the server was closing
    assert stats["refused"] + stats["cancelled"] == sum(s == 503 for s, _ in answers)
