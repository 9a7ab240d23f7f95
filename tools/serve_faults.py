"""How much each fault the server guards against costs a well-behaved request: `serve` under load, timed.

    python tools/serve_faults.py [--backend cpu|numpy] [--repeats 5] [--refusals 1000] [--json]

One server in this process, as the faults were reported (4 slots, MTP, the prefix cache, no chunking, the
default Limits), over the shipped tiny model. A SHORT request (32 tokens, greedy, not streamed) is timed alone,
then beside each fault:

    stop strings   another request carries 4 stop strings of MAX_STOP_CHARS characters that never match and
                   generates 300 tokens (matching is linear: the short one should not notice)
    refusal flood  threads send, without pause, bodies over Limits.max_body (413 from Content-Length, before
                   the body is read) and prompts just under the byte check that are refused while encoding
                   (400 at the context): parsing and encoding are bounded, so the engine thread keeps stepping
    slowloris      100 connections send a header byte a second (the header deadline drops each after
                   header_timeout_s; they come back at once, so 100 are always open)
    3 long         three requests of max_tokens 1000 hold three slots (fair admission: long ones hold at
                   most slots - 1), the short one takes the last
    4 long, last   four long ones arrive first (the fourth waits), then the short one: it must not wait
                   for a long one to end

Each figure is the median of --repeats runs with its min-max spread, and its ratio to alone (the goal: within
2x). Every short answer is checked against the alone one, so a figure is never of a wrong output. Then the RSS
of this process before and after --refusals refused large requests (half 413, half refused at encode) and
after gc.collect() (the goal: within 50 MB).

The timings are this machine's: tests/test_serve_load.py asserts the invariants (exact text, freed slots, a
well-formed reply to every client) and never a speed.
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import multiprocessing
import re
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

import tinyspec
from tinyspec.backends import load_model
from tinyspec.mtp import MTPDrafter
from tinyspec.scheduler import EngineOptions
from tinyspec.serve import Server
from tinyspec.textstream import MAX_STOP_CHARS
from tinyspec.tokenizer import Tokenizer

MODEL = Path(tinyspec.__file__).resolve().parent / "assets" / "tiny-target.gguf"
TIMEOUT = 120  # seconds any one client call may take
SHORT = {"prompt": "def main(", "max_tokens": 32, "temperature": 0}
LONG_PROMPTS = ("import os\n", "class Foo:", "def f(x):", "for i in range(", "import numpy as np\n")


# ------------------------------------------------------------------------------------------ clients

def post(srv: Server, body: dict) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(srv.host, srv.port, timeout=TIMEOUT)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def get(srv: Server, path: str) -> dict:
    conn = http.client.HTTPConnection(srv.host, srv.port, timeout=TIMEOUT)
    try:
        conn.request("GET", path)
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def timed_short(srv: Server, expected: str | None) -> float:
    """Seconds for the short request; its text must be the alone one's."""
    t0 = time.perf_counter()
    status, body = post(srv, SHORT)
    seconds = time.perf_counter() - t0
    assert status == 200, body
    assert expected is None or body["choices"][0]["text"] == expected, "the short request's text changed"
    return seconds


def wait_until(what, timeout: float = TIMEOUT) -> None:
    t_end = time.monotonic() + timeout
    while not what():
        if time.monotonic() > t_end:
            raise TimeoutError("the server did not get there in time")
        time.sleep(0.01)


def wait_idle(srv: Server) -> None:
    wait_until(lambda: (h := get(srv, "/health"))["slots_busy"] == 0 and h["waiting"] == 0 and srv.engine.done())


class Stream(threading.Thread):
    """A streamed request on a raw socket, read until it ends or close() (which cancels it on the server)."""

    def __init__(self, srv: Server, body: dict):
        super().__init__(daemon=True)
        data = json.dumps(body | {"stream": True}).encode()
        self.sock = socket.create_connection((srv.host, srv.port), timeout=TIMEOUT)
        self.sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
        self.reply, self.first, self.closed = b"", threading.Event(), False
        self.start()

    def run(self) -> None:
        try:
            while more := self.sock.recv(65536):
                self.reply += more
                if b"data: " in self.reply:
                    self.first.set()
                if b"data: [DONE]" in self.reply:  # (chunked: the chunk framing follows it)
                    break
        except OSError:
            pass
        self.first.set()

    def close(self) -> None:
        self.sock.close()
        self.join(TIMEOUT)


# ------------------------------------------------------------------------------------------ faults

class Refusals:
    """Bodies the server refuses: over max_body (413, from Content-Length) and prompts refused while encoding
    (just under the byte check, distinct words, so each costs a context's worth of encoding). Each is made
    from one template by a cheap byte replace, so making them costs the client next to nothing."""

    def __init__(self, host: str, port: int, n_bytes: int, too_big: int, salt: int = 0):
        self.host, self.port, self.too_big = host, port, too_big
        self.template = b" ".join(b"w%xz" % i for i in range(n_bytes // 7))[:n_bytes]
        self.n, self.salt, self.lock = 0, salt, threading.Lock()

    def send(self, at_encode: bool) -> int:
        """One refused request; its status (-1: no well-formed HTTP reply with a JSON error body)."""
        if at_encode:
            with self.lock:
                self.n += 1
                tag = b"q%xs%x" % (self.n, self.salt)
            text = self.template.replace(b"z", tag)[:len(self.template)]
            data = b'{"prompt": "' + text + b'", "max_tokens": 1}'
            head = b"Content-Length: %d\r\n\r\n" % len(data)
        else:  # a client that streams its body: the 413 comes from the headers, the rest is never sent
            data = b'{"prompt": "' + b"x" * 1000
            head = b"Content-Length: %d\r\n\r\n" % self.too_big
        try:
            with socket.create_connection((self.host, self.port), timeout=TIMEOUT) as sock:
                sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             + head + data)
                return status_if_well_formed(read_reply(sock))
        except OSError:
            return -1


def read_reply(sock: socket.socket) -> bytes:
    """One HTTP reply: its headers and as many body bytes as its Content-Length (or all until the server closes:
    a kept-alive connection stays open after a 400)."""
    reply = b""
    while more := sock.recv(65536):
        reply += more
        head, sep, body = reply.partition(b"\r\n\r\n")
        length = re.search(rb"(?i)\r\ncontent-length: (\d+)", head)
        if sep and length and len(body) >= int(length.group(1)):
            break
    return reply


def status_if_well_formed(reply: bytes) -> int:
    """The status of an HTTP/1.1 reply whose body is a JSON error (as complete as its Content-Length), else -1."""
    head, _, body = reply.partition(b"\r\n\r\n")
    m = re.match(rb"HTTP/1\.1 (\d{3}) ", head)
    length = re.search(rb"(?i)\r\ncontent-length: (\d+)", head)
    if m is None or length is None or len(body) != int(length.group(1)):
        return -1
    try:
        return int(m.group(1)) if "error" in json.loads(body) else -1
    except ValueError:
        return -1


def refuser(host: str, port: int, n_bytes: int, too_big: int, salt: int, threads: int, count: int | None,
            stop, out) -> None:
    """A client process: `threads` threads (odd ones at-encode prompts, even ones 413 bodies) send refused
    requests until `count` are sent (None: until `stop` is set); puts its replies by status on `out`. In a
    process of its own, so that the client's work and memory are not counted as the server's."""
    refusals, counts, lock = Refusals(host, port, n_bytes, too_big, salt), {}, threading.Lock()
    jobs = iter(range(count)) if count is not None else None

    def run(at_encode: bool) -> None:
        while not stop.is_set():
            if jobs is not None:
                with lock:
                    i = next(jobs, None)
                if i is None:
                    return
                at_encode = i % 2 == 1
            status = refusals.send(at_encode)
            with lock:
                counts[status] = counts.get(status, 0) + 1

    workers = [threading.Thread(target=run, args=(i % 2 == 1,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    out.put(counts)


class Clients:
    """Client processes running refuser; wait() -> their replies by status, summed."""

    def __init__(self, srv: Server, tok: Tokenizer, processes: int, threads: int, count: int | None = None):
        ctx = multiprocessing.get_context("spawn")
        self.stop, self.out = ctx.Event(), ctx.Queue()
        n_bytes = srv.ctx * tok.max_token_bytes - 1000  # just under what the byte check refuses
        shares = [None] * processes if count is None else [count // processes + (i < count % processes)
                                                            for i in range(processes)]
        self.procs = [ctx.Process(target=refuser, args=(srv.host, srv.port, n_bytes, srv.limits.max_body + 1,
                                                         i, threads, share, self.stop, self.out), daemon=True)
                      for i, share in enumerate(shares)]
        for p in self.procs:
            p.start()

    def wait(self, stop: bool = True) -> dict:
        if stop:
            self.stop.set()
        counts: dict[str, int] = {}
        for _ in self.procs:
            for status, n in self.out.get(timeout=TIMEOUT * 5).items():
                counts[str(status)] = counts.get(str(status), 0) + n
        for p in self.procs:
            p.join(TIMEOUT)
        return dict(sorted(counts.items()))


class Slowloris:
    """n connections, each sending a header byte a second, reopened as soon as the server drops one."""

    def __init__(self, srv: Server, n: int = 100):
        self.srv, self.stopping, self.dropped = srv, threading.Event(), 0
        self.socks = [self.open() for _ in range(n)]
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def open(self) -> socket.socket:
        sock = socket.create_connection((self.srv.host, self.srv.port), timeout=5)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        return sock

    def run(self) -> None:
        while not self.stopping.wait(1.0):
            for i, sock in enumerate(self.socks):
                try:
                    sock.sendall(b"X")
                except OSError:
                    sock.close()
                    self.dropped += 1
                    self.socks[i] = self.open()

    def stop(self) -> int:
        self.stopping.set()
        self.thread.join(TIMEOUT)
        for sock in self.socks:
            sock.close()
        return self.dropped


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) / 1024


# ------------------------------------------------------------------------------------------ scenarios

def measure(backend: str, repeats: int, n_refusals: int, say) -> dict:
    model = load_model(MODEL, backend)
    tok = Tokenizer.from_gguf(model.metadata)
    srv = Server(model, tok, "tiny-target", EngineOptions(slots=4, chunk=None, prefix_cache=True),
                 drafter=MTPDrafter(model), spec="mtp", port=0).start()
    try:
        return run_scenarios(srv, tok, backend, repeats, n_refusals, say)
    finally:
        srv.close()


def run_scenarios(srv: Server, tok: Tokenizer, backend: str, repeats: int, n_refusals: int, say) -> dict:
    for _ in range(3):  # warm up: the kernels (cpu: Numba's cache), a batched pass, the tokenizer's tables
        streams = [Stream(srv, {"prompt": p, "max_tokens": 40, "temperature": 0}) for p in LONG_PROMPTS[:3]]
        post(srv, SHORT)
        for s in streams:
            s.join(TIMEOUT)
    wait_idle(srv)
    expected = post(srv, SHORT)[1]["choices"][0]["text"]
    results = []

    def run(name: str, setup=lambda: None, teardown=lambda state: None, between_s: float = 0.0) -> dict:
        """repeats x (setup(), time the short request, teardown(state)); teardown's notes are kept."""
        say(f"  {name} ...")
        seconds, notes = [], []
        for _ in range(repeats):
            state = setup()
            seconds.append(timed_short(srv, expected))
            notes.append(teardown(state))
            time.sleep(between_s)
        wait_idle(srv)
        result = {"name": name, "seconds": seconds, "notes": [n for n in notes if n is not None]}
        results.append(result)
        return result

    run("alone")

    stops = [chr(0x2600 + i) * MAX_STOP_CHARS for i in range(4)]  # symbols the tiny model never writes

    def stop_setup():
        s = Stream(srv, {"prompt": "import os\n", "max_tokens": 300, "temperature": 0, "stop": stops})
        s.first.wait(TIMEOUT)
        return s

    def stop_teardown(s: Stream):
        s.join(TIMEOUT)  # it runs its 300 tokens to the end
        return {"long_ran_300": b"data: [DONE]" in s.reply and b'"finish_reason": "length"' in s.reply}

    run("stop strings", stop_setup, stop_teardown)

    flood = Clients(srv, tok, processes=2, threads=2)  # per process: one 413 thread, one at-encode thread
    wait_until(lambda: srv.stats()["refused"] >= 20)  # the flood under way
    result = run("refusal flood")
    result["replies"] = flood.wait()

    loris = Slowloris(srv)
    time.sleep(1.0)
    # spread over the header deadline and more, so the server drops (and the clients reopen) every connection
    result = run("slowloris", between_s=(srv.limits.header_timeout_s + 2) / repeats)
    result["dropped_by_header_deadline"] = loris.stop()

    def longs(n: int):
        def setup():
            streams = [Stream(srv, {"prompt": LONG_PROMPTS[i], "max_tokens": 1000, "temperature": 0})
                       for i in range(n)]
            # all n in (slots - 1 running, the rest waiting); not "the first ones streaming": under load they
            # may be admitted in another order, and one may end before a late one starts
            wait_until(lambda: (h := get(srv, "/health"))["slots_busy"] + h["waiting"] >= n)
            return streams

        def teardown(streams):
            health = get(srv, "/health")
            for s in streams:
                s.close()
            return {"slots_busy": health["slots_busy"], "waiting": health["waiting"],
                    "longs_still_running": all(b"data: [DONE]" not in s.reply for s in streams)}
        return setup, teardown

    run("3 long", *longs(3))
    run("4 long, short last", *longs(4))

    say(f"  RSS over {n_refusals} refused requests ...")
    gc.collect()
    rss = {"before_mb": rss_mb(), "requests": n_refusals}
    t0 = time.perf_counter()
    rss["replies"] = Clients(srv, tok, processes=2, threads=2, count=n_refusals).wait(stop=False)
    rss["seconds"] = time.perf_counter() - t0
    rss["after_mb"] = rss_mb()
    gc.collect()
    rss["after_gc_mb"] = rss_mb()
    rss["growth_mb"] = rss["after_gc_mb"] - rss["before_mb"]
    rss["within_50_mb"] = rss["growth_mb"] < 50
    stats = get(srv, "/v1/stats")

    alone = statistics.median(results[0]["seconds"])
    for r in results:
        s = r["seconds"]
        r |= {"median_s": statistics.median(s), "min_s": min(s), "max_s": max(s), "repeats": len(s),
              "ratio": statistics.median(s) / alone}
        r["within_2x"] = r["ratio"] <= 2.0
    return {"backend": backend, "cpu": cpu(), "short": SHORT, "repeats": repeats, "scenarios": results, "rss": rss,
            "server_stats": {k: stats[k] for k in ("requests", "refused", "cancelled", "timed_out")}}


def cpu() -> dict:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"model": None, "avx512_vnni": None, "cores": None}
    model = re.search(r"model name\s*:\s*(.*)", text)
    flags = re.search(r"flags\s*:\s*(.*)", text)
    return {"model": model.group(1).strip() if model else None,
            "avx512_vnni": "avx512_vnni" in flags.group(1).split() if flags else None,
            "cores": text.count("processor\t:")}


def table(out: dict) -> str:
    c = out["cpu"]
    lines = [(f"serve faults: backend {out['backend']}, {c['model']} ({c['cores']} cores, avx512_vnni "
              f"{c['avx512_vnni']}); short request: {out['short']['max_tokens']} tokens greedy, "
              f"{out['repeats']} repeats each"),
             f"  {'scenario':20s} {'median':>8s} {'min':>8s} {'max':>8s} {'ratio':>6s}  within 2x"]
    for r in out["scenarios"]:
        lines.append(f"  {r['name']:20s} {r['median_s'] * 1e3:6.0f}ms {r['min_s'] * 1e3:6.0f}ms "
                     f"{r['max_s'] * 1e3:6.0f}ms {r['ratio']:5.2f}x  {'yes' if r['within_2x'] else 'NO'}")
    extra = {r["name"]: r for r in out["scenarios"]}
    lines.append(f"  flood replies by status (-1: none well-formed): {extra['refusal flood']['replies']}; slowloris "
                 f"connections dropped by the header deadline: {extra['slowloris']['dropped_by_header_deadline']}")
    rss = out["rss"]
    lines.append(f"  RSS: {rss['before_mb']:.0f} MB before, {rss['after_mb']:.0f} MB after {rss['requests']} refused "
                 f"requests ({rss['seconds']:.0f} s; replies by status {rss['replies']}), {rss['after_gc_mb']:.0f} MB "
                 f"after gc.collect(): {rss['growth_mb']:+.1f} MB ({'within' if rss['within_50_mb'] else 'NOT within'}"
                 " 50 MB)")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=("numpy", "cpu"), default="cpu")
    ap.add_argument("--repeats", type=int, default=5, help="runs of the short request per scenario")
    ap.add_argument("--refusals", type=int, default=1000, help="refused large requests for the RSS figure")
    ap.add_argument("--json", action="store_true", help="print JSON (the table goes to stderr)")
    a = ap.parse_args(argv)
    if a.repeats < 1 or a.refusals < 0:
        ap.error("--repeats must be >= 1 and --refusals >= 0")

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    out = measure(a.backend, a.repeats, a.refusals, say)
    out["wall_s"] = time.perf_counter() - t0
    if a.json:
        print(json.dumps(out, indent=1))
        say(table(out))
    else:
        print(table(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
