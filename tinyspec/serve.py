"""An OpenAI-shaped HTTP server over ONE running batch engine: `python -m tinyspec serve`.

    client --HTTP--> handler thread --inbox--> engine thread --events--> handler thread --HTTP--> client
                     (one per connection:         (the only one that      (its own request's events:
                      parse, check, encode)        touches the engine)     text, end, error)

Thread model. http.server's ThreadingHTTPServer gives each connection a thread; a thread parses and checks its
request (openai_api.py), encodes the prompt, and puts a Job on the engine's inbox, then waits on the job's own
event queue. ONE engine thread owns the Engine (speculate.py, over a paged KV pool as batch.py's): between two
steps it takes what arrived (new jobs: Engine.add with the request's own sampling, seed and stop ids;
cancellations: Engine.cancel), then makes one step for every running sequence. Why one thread: a step is ONE
verify pass for every sequence (that is the point of batching), and the model's states, the KV pool, the
rollback rings and the drafters are plain objects no lock guards; with a single owner they need none, and a
request's tokens are exactly its solo run's (greedy, and sampled with its seed: the engine's guarantee, whatever
else shares the pass).

Streaming. Each step's run reaches its job through on_emit: the ids are decoded incrementally (a character
split across tokens waits for its last byte) and held back while the text's end could still begin a stop string
(TextStream). Released text goes to the handler, which writes it as a server-sent event in OpenAI's chunk shape;
the stream ends with a chunk carrying finish_reason and the request's speculation stats, then `data: [DONE]`.
A stop string met cuts the text there and cancels the sequence after the step.

Cancellation. A client that goes away (its socket reads as closed while it waits, or a write fails mid-stream)
cancels its job: the engine thread removes the sequence between steps and its slot and KV blocks serve the next
one. Ctrl-C (Server.close) stops accepting, ends every job in flight with a 503 error (an error event
mid-stream), and lets the handlers write it before the process exits.

Stats. Every response carries usage and a `tinyspec` object with its own speculation stats (steps, drafted,
accepted, acceptance_rate, tokens_per_step, ...); GET /v1/stats sums the server's (requests, tokens, tok/s,
acceptance, the prefix cache's hits and the engine's preemptions).

Does NOT include: authentication, TLS, several choices per request, request priorities (FIFO), the Responses
API. For a serving stack, see vLLM or llama.cpp's llama-server; this is the smallest one that shows the loop.
"""

from __future__ import annotations

import itertools
import json
import queue
import secrets
import select
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from .drafting import Drafter, DraftPolicy, policy_for
from .openai_api import DEFAULT_MAX_TOKENS, Ask, BadRequest, ChatTemplate, completion_body, parse_request, usage
from .scheduler import EngineOptions, check_prompt
from .sequence import SeqResult
from .speculate import Engine
from .textstream import TokenText

BLOCK_SIZE = 16  # positions per KV block
MAX_BODY = 16 << 20  # bytes of a request body at most
MAX_WAITING = 1024  # jobs queued for a slot at most; more: 503, try later
POLL_S = 0.2  # how often a waiting handler looks whether its client is still there
STATS_SHOWN = ("steps", "plain_steps", "drafted", "accepted", "acceptance_rate", "rollbacks", "tokens_per_s")


class TextStream:
    """Token ids in, final text out: UTF-8 decoded incrementally (textstream.TokenText), held back while its end
    could begin a stop string, and cut where the first stop string to be completed begins (`stopped`: then
    nothing more comes out)."""

    def __init__(self, tokenizer, stops: tuple[str, ...]):
        self.decoded, self.stops = TokenText(tokenizer), stops
        self.text = ""  # decoded so far
        self.sent = 0  # characters of text released
        self.stopped = False

    def feed(self, tokens: list[int]) -> str:
        self.text += self.decoded.feed(tokens)
        return self._release(final=False)

    def finish(self) -> str:
        self.text += self.decoded.finish()
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        if self.stopped:
            return ""
        # the stop string met first is the one that ENDS first (generation stops there, whatever the run sizes);
        # none begins before `sent`: released text never ends with the start of one (held back)
        found = [(i + len(s), i) for s, i in ((s, self.text.find(s, self.sent)) for s in self.stops) if i >= 0]
        if found:
            end, self.stopped = min(found)[1], True
        elif final:
            end = len(self.text)
        else:  # hold back the longest tail that a stop string begins with
            end = len(self.text) - max((n for s in self.stops for n in range(1, len(s))
                                        if self.text.endswith(s[:n])), default=0)
        out, self.sent = self.text[self.sent : max(end, self.sent)], max(end, self.sent)
        return out


@dataclass
class Job:
    """One request inside the server: its Ask, its sequence in the engine, its text, and the queue its handler
    reads (events: ("text", str), ("end", finish_reason, n_generated, stats), ("error", BadRequest))."""
    ask: Ask
    seq: SeqResult
    max_new: int
    seed: int
    text: TextStream
    events: queue.Queue = field(default_factory=queue.Queue)
    t_arrive: float = field(default_factory=time.perf_counter)
    t_start: float | None = None  # when it joined a slot (its first token)
    gone: bool = False  # its client went away, or the server is closing: nobody reads its events


@dataclass
class Totals:
    """The server's aggregate counts, written by the engine thread, read (under the lock) by /v1/stats."""
    requests: int = 0  # answered with tokens (finished or stopped)
    refused: int = 0  # 4xx / 503
    cancelled: int = 0  # client gone or server closing
    prompt_tokens: int = 0
    generated: int = 0
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    busy_s: float = 0.0  # time the engine spent stepping
    running: int = 0
    waiting: int = 0


class Server:
    """The engine thread and the HTTP server around one model. start() listens (port 0: any free one, see
    .port) and serves in background threads; close() ends everything in flight and stops (the module docstring)."""

    def __init__(self, model, tokenizer, model_name: str, options: EngineOptions = EngineOptions(slots=4),
                 drafter: Drafter | None = None, policy: DraftPolicy | None = None, spec: str = "none",
                 ctx: int | None = None, host: str = "127.0.0.1", port: int = 8080,
                 log: Callable[[str], None] | None = None):
        """options: the engine's (slots, chunk: a joining prompt's prefill rows per pass, so the running requests
        wait at most that many extra rows; prefix_cache: a prompt that starts like an earlier one prefills only the
        rest). The server sizes its KV pool (every slot's longest run: ctx positions and a pass's drafts, its
        drafter's KV too, so admission never waits) and stops at the tokenizer's end-of-generation ids."""
        self.model, self.tokenizer, self.model_name, self.spec, self.log = model, tokenizer, model_name, spec, log
        self.ctx = model.cfg.n_ctx if ctx is None else ctx
        if not 1 <= self.ctx <= model.cfg.n_ctx:
            raise ValueError(f"the context per request must be in 1..{model.cfg.n_ctx} (the model's), got {ctx}")
        policy = policy_for(0 if drafter is None else None, policy)
        options = replace(options, run_length=self.ctx, block_size=BLOCK_SIZE, stop_ids=tuple(tokenizer.eog_ids))
        self.engine = Engine(model, drafter, policy, options, on_emit=self._on_emit, on_finish=self._on_finish)
        self.prefix_cache = self.engine.prefix_cache
        template = model.metadata.get("tokenizer.chat_template")
        self.chat: ChatTemplate | None = None
        self.chat_unavailable: str | None = None  # why a file's template cannot be rendered (chat answers 501)
        if template is not None:
            try:
                self.chat = ChatTemplate(str(template), *self._bos_eos())
            except ValueError as e:  # jinja2 missing, or a template that does not parse: completions still serve
                self.chat_unavailable = str(e)
        self.inbox: queue.Queue = queue.Queue()
        self.jobs: dict[int, Job] = {}  # seq.index -> job, while the engine holds it (engine thread only)
        self.stop_met: list[Job] = []  # jobs whose stop string appeared in this step: cancelled after it
        self.totals, self.lock = Totals(), threading.Lock()
        self.encoding = threading.Lock()  # one handler at a time in the tokenizer (its word cache is a plain dict)
        self.ids = itertools.count()  # a job's number (its SeqResult.index)
        self.created = int(time.time())
        self.closing = threading.Event()
        self.handlers = 0  # handler threads inside a request (close() waits for them to write their last bytes)
        self.httpd = HTTPServer((host, port), Handler, self)
        self.host, self.port = self.httpd.server_address[:2]
        self.url = f"http://{self.host}:{self.port}"
        self.engine_thread = threading.Thread(target=self._engine_loop, name="tinyspec-engine", daemon=True)
        self.http_thread: threading.Thread | None = None

    def _bos_eos(self) -> tuple[str, str]:
        t = self.tokenizer
        return tuple(t.id_to_token(i) if i is not None else "" for i in (t.bos_id, t.eos_id))

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> "Server":
        self.engine_thread.start()
        self.http_thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                            name="tinyspec-http", daemon=True)
        self.http_thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve on the calling thread until Ctrl-C (KeyboardInterrupt), then close()."""
        self.engine_thread.start()
        try:
            self.httpd.serve_forever(poll_interval=0.1)
        except KeyboardInterrupt:
            pass
        finally:
            self.close()

    def close(self, grace_s: float = 5.0) -> None:
        """Stop accepting, end every job in flight with a 503, wait (up to grace_s) for the handlers to write it."""
        if self.closing.is_set():
            return
        self.closing.set()
        if self.http_thread is not None:  # serve_forever on another thread: tell it to stop
            self.httpd.shutdown()
        self.inbox.put(("close", None))
        self.engine_thread.join(timeout=grace_s)
        t_end = time.perf_counter() + grace_s
        while self.handlers and time.perf_counter() < t_end:
            time.sleep(0.02)
        self.httpd.server_close()

    # ------------------------------------------------------------------------------------------ engine thread

    def _engine_loop(self) -> None:
        engine = self.engine
        while True:
            try:  # idle: wait for work; busy: take what arrived and step on
                message = self.inbox.get() if engine.done() else self.inbox.get_nowait()
            except queue.Empty:
                message = None
            while message is not None:
                what, job = message
                if what == "close":
                    self._end_all(BadRequest("the server is shutting down", status=503))
                    return
                self._take(what, job)
                try:
                    message = self.inbox.get_nowait()
                except queue.Empty:
                    message = None
            with self.lock:
                self.totals.running, self.totals.waiting = len(engine.active), len(engine.waiting)
            if engine.done():
                continue
            t = time.perf_counter()
            try:
                engine.step()
            except Exception as e:  # a bug in a step: every job in flight hears it, the server keeps serving
                print(f"tinyspec serve: error in an engine step: {type(e).__name__}: {e}", file=sys.stderr)
                self._end_all(BadRequest(f"internal error in the engine: {type(e).__name__}: {e}", status=500))
            for job in self.stop_met:
                engine.cancel(job.seq)  # its stop string appeared: ends now (on_finish)
            self.stop_met.clear()
            with self.lock:
                self.totals.busy_s += time.perf_counter() - t
                self.totals.steps += 1
                self.totals.running, self.totals.waiting = len(engine.active), len(engine.waiting)

    def _take(self, what: str, job: Job) -> None:
        if what == "cancel":
            if self.jobs.get(job.seq.index) is job and self.engine.cancel(job.seq):  # running: on_finish counts it
                if self.jobs.pop(job.seq.index, None) is not None:  # it was waiting (no on_finish)
                    with self.lock:
                        self.totals.cancelled += 1
            return
        if job.gone:  # its client left before it was queued
            with self.lock:
                self.totals.cancelled += 1
            return
        if len(self.engine.waiting) >= MAX_WAITING:
            return self._refuse(job, BadRequest(f"{MAX_WAITING} requests are already waiting: try again later",
                                                status=503))
        self.engine.add(job.seq, job.max_new, job.seed, params=job.ask.params, stop_ids=self.tokenizer.eog_ids)
        if job.seq.error is not None:  # checked before, so rare: the engine's own word
            return self._refuse(job, BadRequest(job.seq.error, "prompt"))
        self.jobs[job.seq.index] = job

    def _refuse(self, job: Job, error: BadRequest) -> None:
        job.events.put(("error", error))  # its handler raises it (and counts it refused)

    def _end_all(self, error: BadRequest) -> None:
        """Every job in flight ends with `error` (shutdown, or a failed step) and leaves the engine."""
        for job in list(self.jobs.values()):
            job.events.put(("error", error))
            job.gone = True
            try:
                self.engine.cancel(job.seq)
            except Exception:  # after a failed step the engine's books may be off: the job is gone regardless
                pass
        self.jobs.clear()
        self.stop_met.clear()
        with self.lock:
            self.totals.running, self.totals.waiting = 0, 0

    def _on_emit(self, seq: SeqResult, tokens: list[int], marks: list[str]) -> None:
        job = self.jobs[seq.index]
        if job.t_start is None:
            job.t_start = time.perf_counter()
        text = job.text.feed(tokens)
        if text:
            job.events.put(("text", text))
        if job.text.stopped and job not in self.stop_met:
            self.stop_met.append(job)

    def _on_finish(self, seq: SeqResult) -> None:
        job = self.jobs.pop(seq.index, None)
        n = len(seq.tokens)
        with self.lock:
            t = self.totals
            t.generated += n
            t.drafted += seq.stats.get("drafted", 0)
            t.accepted += seq.stats.get("accepted", 0)
            t.prompt_tokens += len(seq.prompt_tokens)
            if job is None or job.gone:
                t.cancelled += 1
            else:
                t.requests += 1
        if job is None or job.gone:
            return
        tail = job.text.finish()
        if tail:
            job.events.put(("text", tail))
        stopped = job.text.stopped or (n > 0 and seq.tokens[-1] in seq.stop_ids)
        job.events.put(("end", "stop" if stopped or n < job.max_new else "length", n, self._stats(job)))

    def _stats(self, job: Job) -> dict:
        """The request's own speculation stats (the `tinyspec` object of its response)."""
        s = job.seq.stats
        now = time.perf_counter()
        return {"spec": self.spec, "seed": job.seed, "k_max": self.engine.k_max,
                **{k: s[k] for k in STATS_SHOWN if k in s},
                "tokens_per_step": s.get("mean_accepted_length", 0.0),
                "first_token_s": (job.t_start or now) - job.t_arrive, "wall_s": now - job.t_arrive}

    # ------------------------------------------------------------------------------------------ handler side

    def submit(self, ask: Ask) -> Job:
        """A checked Ask -> a Job on the inbox: the prompt encoded and checked against the context (BadRequest)."""
        if self.closing.is_set():
            raise BadRequest("the server is shutting down", status=503)
        if isinstance(ask.prompt, str):
            if (fewest := self.tokenizer.fewest_tokens(ask.prompt)) > self.ctx:  # refused before it is encoded
                raise BadRequest(f"the prompt is at least {fewest} tokens: more than the server's context of "
                                 f"{self.ctx} tokens per request", "messages" if ask.chat else "prompt")
            with self.encoding:
                tokens = self.tokenizer.encode(ask.prompt)
        else:
            tokens = list(ask.prompt)
        where, n = "messages" if ask.chat else "prompt", len(tokens)
        if n > self.ctx:
            raise BadRequest(f"the prompt is {n} tokens: more than the server's context of {self.ctx} tokens per "
                             "request (prompt and output)", where)
        max_new = ask.max_tokens
        if max_new is None:  # completions: OpenAI's 16; chat: the rest of the context (as llama-server)
            max_new = self.ctx - n if ask.chat else min(DEFAULT_MAX_TOKENS, self.ctx - n)
        if n + max_new > self.ctx:
            raise BadRequest(f"a prompt of {n} tokens and max_tokens {max_new} exceed the server's context of "
                             f"{self.ctx} tokens per request: ask for at most {self.ctx - n}", "max_tokens")
        if why := check_prompt(self.model, tokens, max_new):  # empty, or ids outside the vocabulary
            raise BadRequest(why, where)
        seed = ask.seed if ask.seed is not None else secrets.randbits(63)
        job = Job(ask, SeqResult(next(self.ids), tokens), max_new, seed, TextStream(self.tokenizer, ask.stops))
        self.inbox.put(("add", job))
        return job

    def cancel(self, job: Job) -> None:
        job.gone = True
        self.inbox.put(("cancel", job))

    def health(self) -> dict:
        with self.lock:
            t = self.totals
            return {"status": "closing" if self.closing.is_set() else "ok", "slots": self.engine.slots,
                    "slots_busy": t.running, "waiting": t.waiting}

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": self.created,
                                            "owned_by": "tinyspec", "context_length": self.ctx,
                                            "chat_template": self.chat is not None}]}

    def stats(self) -> dict:
        with self.lock:
            t = self.totals
            return {"requests": t.requests, "refused": t.refused, "cancelled": t.cancelled,
                    "running": t.running, "waiting": t.waiting, "slots": self.engine.slots, "spec": self.spec,
                    "k_max": self.engine.k_max, "prompt_tokens": t.prompt_tokens, "generated": t.generated,
                    "steps": t.steps, "busy_s": t.busy_s, "tok_s": t.generated / t.busy_s if t.busy_s else 0.0,
                    "drafted": t.drafted, "accepted": t.accepted,
                    "acceptance_rate": t.accepted / t.drafted if t.drafted else 0.0,
                    "prefix_hits": 0 if self.prefix_cache is None else self.prefix_cache.hits,
                    "preemptions": self.engine.preemptions}


class HTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that knows its tinyspec Server, with a backlog for many clients at once."""
    daemon_threads = True
    request_queue_size = 256  # connections the kernel queues before accept: 100 clients at once all get in

    def __init__(self, address, handler, app: Server):
        self.app = app
        super().__init__(address, handler)


class Handler(BaseHTTPRequestHandler):
    """One connection: routes, reads and checks the body, waits on its job, writes JSON or server-sent events."""
    protocol_version = "HTTP/1.1"  # keep-alive (the openai client reuses connections); a stream closes its own
    timeout = 60  # seconds a socket read or write may stall (a client that sends half a body, or stops reading)
    server: HTTPServer
    next_look = 0.0  # when next_event next looks whether the client is still there (time.monotonic)

    def log_message(self, format, *args) -> None:  # quiet: the server's own lines go to stderr when asked
        if self.server.app.log:
            self.server.app.log(f"{self.address_string()} {format % args}")

    def do_GET(self) -> None:
        app, path = self.server.app, self.path.split("?")[0].rstrip("/")
        routes = {"/health": app.health, "/v1/models": app.models, "/v1/stats": app.stats, "/stats": app.stats}
        if path not in routes:
            return self.send_json(404, BadRequest(f"no such endpoint: GET {path}", status=404).body())
        self.send_json(200, routes[path]())

    def do_POST(self) -> None:
        app = self.server.app
        with app.lock:
            app.handlers += 1
        try:
            path = self.path.split("?")[0].rstrip("/")
            if path not in ("/v1/completions", "/v1/chat/completions"):
                self.close_connection = True  # its body is not read: the connection cannot be reused
                raise BadRequest(f"no such endpoint: POST {path}", status=404)
            chat = path == "/v1/chat/completions"
            if chat and app.chat_unavailable:
                self.close_connection = True  # its body is not read
                raise BadRequest(app.chat_unavailable, "messages", status=501)
            ask = parse_request(self.read_json(), chat, app.chat.render if app.chat else None)
            self.answer(app.submit(ask))
        except BadRequest as e:
            with app.lock:
                app.totals.refused += 1
            self.send_json(e.status, e.body())
        except (BrokenPipeError, ConnectionResetError, TimeoutError):  # the client left, or stalled past `timeout`
            self.close_connection = True
        finally:
            with app.lock:
                app.handlers -= 1

    def read_json(self):
        length = self.headers.get("Content-Length")
        if length is None:
            self.close_connection = True  # where would a body end?
            raise BadRequest("a request body with a Content-Length is needed", status=411)
        if not length.isdigit() or int(length) > MAX_BODY:
            self.close_connection = True  # the body is not read: the connection cannot be reused
            raise BadRequest(f"the body must be at most {MAX_BODY} bytes", status=413)
        raw = self.rfile.read(int(length))
        try:
            return json.loads(raw)
        except UnicodeDecodeError:
            raise BadRequest("the body is not UTF-8 text") from None
        except json.JSONDecodeError as e:
            raise BadRequest(f"malformed JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
        except RecursionError:  # [[[[...]]]] a hundred thousand deep
            raise BadRequest("malformed JSON: nested too deeply") from None

    # ------------------------------------------------------------------------------------------ answering

    def next_event(self, job: Job):
        """The job's next event; None if its client went away meanwhile (then the job is cancelled). Events may
        come faster than POLL_S (a step's text), so the client is looked at by the clock, not on a quiet queue."""
        while True:
            try:
                event = job.events.get(timeout=POLL_S)
            except queue.Empty:
                event = None
            if event is None and not self.server.app.engine_thread.is_alive():  # it closed before taking the job
                return "error", BadRequest("the server is shutting down", status=503)
            if event is None or time.monotonic() >= self.next_look:
                self.next_look = time.monotonic() + POLL_S
                if self.client_gone():
                    self.server.app.cancel(job)
                    return None
            if event is not None:
                return event

    def client_gone(self) -> bool:
        """A closed socket reads as ready with no bytes; a client that sends more (a pipelined request) is here."""
        try:
            ready, _, _ = select.select([self.connection], [], [], 0)
            return bool(ready) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def answer(self, job: Job) -> None:
        app, ask = self.server.app, job.ask
        rid = f"{'chatcmpl' if ask.chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        model = ask.model or app.model_name
        if ask.stream:
            return self.answer_stream(job, rid, model)
        parts = []
        while (event := self.next_event(job)) is not None:
            if event[0] == "text":
                parts.append(event[1])
            elif event[0] == "error":
                raise event[1]
            else:
                _, finish_reason, n, stats = event
                body = completion_body(ask, rid, app.created, model, "".join(parts), finish_reason, chunk=False)
                body["usage"], body["tinyspec"] = usage(len(job.seq.prompt_tokens), n), stats
                return self.send_json(200, body)
        self.close_connection = True  # the client went away: nothing to answer

    def answer_stream(self, job: Job, rid: str, model: str) -> None:
        app, ask = self.server.app, job.ask
        first = True
        event = self.next_event(job)  # before the headers: a refusal is still a plain 4xx / 503
        if event is None:
            return
        if event[0] == "error":
            raise event[1]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")  # the stream's end is the connection's end
        self.end_headers()
        self.close_connection = True
        try:
            while event is not None:
                if event[0] == "text":
                    self.send_event(completion_body(ask, rid, app.created, model, event[1], None, True, first))
                    first = False
                elif event[0] == "error":
                    self.send_event(event[1].body())
                    break
                else:
                    _, finish_reason, n, stats = event
                    last = completion_body(ask, rid, app.created, model, "", finish_reason, True, first)
                    last["tinyspec"] = stats
                    self.send_event(last)
                    if ask.include_usage:
                        self.send_event({"id": rid, "object": last["object"], "created": app.created, "model": model,
                                         "choices": [], "usage": usage(len(job.seq.prompt_tokens), n)})
                    break
                event = self.next_event(job)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except OSError:  # the client left mid-stream (a broken pipe, a reset, a write that timed out)
            app.cancel(job)

    def send_event(self, body: dict) -> None:
        self.wfile.write(b"data: " + json.dumps(body).encode() + b"\n\n")
        self.wfile.flush()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a request line that does not parse, a method it has no do_ for, a line
        too long) in the same JSON error shape as ours."""
        self.close_connection = True
        self.send_json(code, BadRequest(message or HTTPStatus(code).phrase, status=code).body())

    def send_json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

