"""An OpenAI-shaped HTTP server over ONE running batch engine: `python -m tinyspec serve`.

    client --HTTP--> http_app (uvicorn + Starlette: read under limits, parse, encode) --inbox--> engine thread
           <--JSON / server-sent events-- http_app <--job events (text, end, error)-- engine thread

This module is the engine side; http_app.py is the HTTP side (docs/http-server.md: the stack and why).

One engine thread. It owns the Engine (speculate.py, over a paged KV pool as batch.py's): between two steps it
takes what arrived (new jobs, cancellations), ends jobs past their deadline (504), admits waiting jobs into free
slots (Engine.add with the request's own sampling, seed, stop ids and draft_n), then makes one step for every
running sequence. Why one thread: a step is ONE verify pass for every sequence (that is the point of batching),
and the model's states, the KV pool, the rollback rings and the drafters are plain objects no lock guards; with
a single owner they need none, and a request's tokens are exactly its solo run's (greedy, and sampled with its
seed: the engine's guarantee, whatever else shares the pass).

Fair admission. Free slots take waiting jobs in arrival order, but long jobs (max_tokens above
Limits.short_tokens) hold at most slots - 1 slots, so a short request never waits for a long one to end.

Streaming. Each step's run reaches its job through on_emit: the ids are decoded incrementally and held back
while the text's end could still begin a stop string (textstream.TextStream, linear in the text), the end-of-
generation token's text left out (textstream.text_ids). A stop string met cuts the text there and cancels the
sequence after the step. Cancellation (a client gone) and shutdown (Server.close: every job in flight ends with
a 503) reach the engine thread through the same inbox.

Limits. What one request or client may take (Limits) is checked on both sides: sizes, counts and deadlines of the
HTTP exchange in http_app, tokens, deadlines and the queue here. Stats: each response's own speculation stats,
/v1/stats and /metrics (Prometheus) for the server's.

Does NOT include: TLS, per-key quotas, several choices per request, request priorities, the Responses API. For a
serving stack, see vLLM or llama.cpp's llama-server; this is the smallest one that shows the loop and can be left
running.
"""

from __future__ import annotations

import itertools
import queue
import secrets
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable

from .drafting import Drafter, DraftPolicy, policy_for
from .http_app import HTTPFront
from .openai_api import DEFAULT_MAX_TOKENS, Ask, BadRequest, ChatTemplate
from .scheduler import EngineOptions, check_prompt
from .sequence import SeqResult
from .speculate import Engine
from .textstream import TextStream, text_ids
from .tokenizer import TooManyTokens

BLOCK_SIZE = 16  # positions per KV block
STATS_SHOWN = ("steps", "plain_steps", "drafted", "accepted", "acceptance_rate", "rollbacks", "tokens_per_s")
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)  # seconds, /metrics' histogram


@dataclass(frozen=True)
class Limits:
    """What one request or one client may take, so that none can freeze, starve or bloat the others (the
    defaults follow llama-server's and vLLM's where they have one; docs/http-server.md says why each)."""
    api_keys: tuple[str, ...] = ()  # Authorization: Bearer KEY on /v1/* (empty: no key asked)
    served_model_names: tuple[str, ...] = ()  # names a request's "model" may give (empty: the file's name)
    max_tokens: int = 1024  # a request's max_tokens at most, and chat's default when it gives none
    short_tokens: int = 256  # max_tokens above this makes a request long: long ones hold at most slots - 1 slots
    request_timeout_s: float = 600.0  # from arrival to the last token; then a 504 (an error event mid-stream)
    max_waiting: int = 256  # requests waiting for a slot at most; more: 503, try later
    max_body: int = 2 << 20  # bytes of a request body at most (413): 8192 prompt tokens of text are ~32 KB
    parse_at_once: int = 2  # bodies parsed and encoded at once (parsing a JSON body inflates it ~10x)
    max_connections: int = 256  # open connections at most; more are answered 503 and closed
    header_timeout_s: float = 10.0  # the request line and headers must arrive within this (slowloris)
    body_timeout_s: float = 30.0  # and the body within this, once the headers are in (408)
    idle_timeout_s: float = 5.0  # a kept-alive connection with no request for this long is closed
    stuck_after_s: float = 60.0  # /health answers 503 when one engine step has run this long

    def __post_init__(self):
        for name in ("max_tokens", "short_tokens", "max_waiting", "max_body", "parse_at_once", "max_connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("request_timeout_s", "header_timeout_s", "body_timeout_s", "idle_timeout_s", "stuck_after_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")


@dataclass(eq=False)  # a job is itself: `in` and remove() on the queue compare identity
class Job:
    """One request inside the server: its Ask, its sequence in the engine, its text, and where its events go.
    post(event) is called on the engine thread (the HTTP side hands it over to its own thread); events:
    ("text", str), ("end", finish_reason, n_generated, stats), ("error", BadRequest)."""
    ask: Ask
    seq: SeqResult
    max_new: int
    seed: int
    text: TextStream
    post: Callable[[tuple], None]
    deadline: float  # time.perf_counter() past which it is ended with a 504
    t_arrive: float = field(default_factory=time.perf_counter)
    t_start: float | None = None  # when its first token was decided
    long: bool = False  # max_new above Limits.short_tokens (fair admission)
    gone: bool = False  # its client went away, or it ended early: nobody reads its events any more
    timed_out: bool = False  # ended past its deadline (counted so, not as cancelled)


@dataclass
class Totals:
    """The server's aggregate counts, written by the engine thread (and refusals by the HTTP side), read under
    the lock by /v1/stats and /metrics."""
    requests: int = 0  # answered with tokens (finished or stopped)
    refused: int = 0  # 4xx / 503 before any token
    cancelled: int = 0  # client gone or server closing
    timed_out: int = 0  # past Limits.request_timeout_s
    prompt_tokens: int = 0
    generated: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_at: list[int] = field(default_factory=list)  # [i]: steps that drafted a token at position i + 1
    accepted_at: list[int] = field(default_factory=list)  # [i]: of which that draft was accepted
    steps: int = 0
    busy_s: float = 0.0  # time the engine spent stepping
    running: int = 0
    waiting: int = 0
    ttft: list[int] = field(default_factory=lambda: [0] * (len(TTFT_BUCKETS) + 1))  # counts per bucket, +Inf last
    ttft_sum: float = 0.0


class Server:
    """The engine thread and the HTTP server around one model. start() listens (port 0: any free one, see
    .port) and serves in background threads; close() ends everything in flight and stops (the module docstring)."""

    def __init__(self, model, tokenizer, model_name: str, options: EngineOptions = EngineOptions(slots=4),
                 drafter: Drafter | None = None, policy: DraftPolicy | None = None, spec: str = "none",
                 ctx: int | None = None, host: str = "127.0.0.1", port: int = 8080,
                 log: Callable[[str], None] | None = None, limits: Limits = Limits()):
        """options: the engine's (slots, chunk: a joining prompt's prefill rows per pass, so the running requests
        wait at most that many extra rows; prefix_cache: a prompt that starts like an earlier one prefills only the
        rest). The server sizes its KV pool (every slot's longest run: ctx positions and a pass's drafts, its
        drafter's KV too, so admission never waits) and stops at the tokenizer's end-of-generation ids. limits:
        what a request or a client may take (Limits)."""
        self.model, self.tokenizer, self.spec, self.log, self.limits = model, tokenizer, spec, log, limits
        self.names = limits.served_model_names or (model_name,)
        self.model_name = self.names[0]
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
        self.queue: deque[Job] = deque()  # waiting for a slot, in arrival order (engine thread only)
        self.jobs: dict[int, Job] = {}  # seq.index -> job, while the engine holds it (engine thread only)
        self.stop_met: list[Job] = []  # jobs whose stop string appeared in this step: cancelled after it
        self.totals, self.lock = Totals(), threading.Lock()
        self.totals.drafted_at = [0] * self.engine.k_max
        self.totals.accepted_at = [0] * self.engine.k_max
        self.encoding = threading.Lock()  # one prompt at a time in the tokenizer (its word cache is a plain dict)
        self.ids = itertools.count()  # a job's number (its SeqResult.index)
        self.step_began: float | None = None  # when the step now running began (None: between steps)
        self.closing = threading.Event()
        self.engine_thread = threading.Thread(target=self._engine_loop, name="tinyspec-engine", daemon=True)
        self.http = HTTPFront(self, host, port)
        self.host, self.port, self.url = self.http.host, self.http.port, self.http.url

    def _bos_eos(self) -> tuple[str, str]:
        t = self.tokenizer
        return tuple(t.id_to_token(i) if i is not None else "" for i in (t.bos_id, t.eos_id))

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> "Server":
        """Serve in background threads (the engine's and the HTTP loop's); returns at once."""
        self.engine_thread.start()
        self.http.start()
        return self

    def serve_forever(self) -> None:
        """Serve until Ctrl-C (KeyboardInterrupt, which SIGTERM also raises in the CLI), then close()."""
        self.start()
        try:
            while self.http.running():
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
        finally:
            self.close()

    def close(self, grace_s: float = 5.0) -> None:
        """Stop accepting, end every job in flight with a 503, wait (up to grace_s) for the handlers to write it."""
        if self.closing.is_set():
            return
        self.closing.set()
        self.inbox.put(("close", None))
        self.engine_thread.join(timeout=grace_s)
        self.http.stop(grace_s)

    # ------------------------------------------------------------------------------------------ engine thread

    def _engine_loop(self) -> None:
        engine = self.engine
        while True:
            try:  # idle: wait for work; busy: take what arrived and step on
                message = self.inbox.get() if engine.done() and not self.queue else self.inbox.get_nowait()
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
            self._expire()
            self._admit()
            self._count_queues()
            if engine.done():
                continue
            t = self.step_began = time.perf_counter()
            try:
                engine.step()
            except Exception as e:  # a bug in a step: every job in flight hears it, the server keeps serving
                print(f"tinyspec serve: error in an engine step: {type(e).__name__}: {e}", file=sys.stderr)
                self._end_all(BadRequest(f"internal error in the engine: {type(e).__name__}: {e}", status=500))
            self.step_began = None
            for job in self.stop_met:
                engine.cancel(job.seq)  # its stop string appeared: ends now (on_finish)
            self.stop_met.clear()
            with self.lock:
                self.totals.busy_s += time.perf_counter() - t
                self.totals.steps += 1
            self._count_queues()

    def _count_queues(self) -> None:
        with self.lock:
            self.totals.running = len(self.engine.active)
            self.totals.waiting = len(self.queue) + len(self.engine.waiting) + len(self.engine.preempted)

    def _take(self, what: str, job: Job) -> None:
        if what == "cancel":
            if job in self.queue:  # still waiting for a slot
                self.queue.remove(job)
                self._count("cancelled")
            elif self.jobs.get(job.seq.index) is job and self.engine.cancel(job.seq):  # running: on_finish counts it
                if self.jobs.pop(job.seq.index, None) is not None:  # it was in the engine's queue (no on_finish)
                    self._count("cancelled")
            return
        if job.gone:  # its client left before it was queued
            return self._count("cancelled")
        if len(self.queue) >= self.limits.max_waiting:
            return self._refuse(job, BadRequest(f"{self.limits.max_waiting} requests are already waiting: try again "
                                                "later", status=503))
        self.queue.append(job)

    def _admit(self) -> None:
        """Fair admission: free slots take waiting jobs in arrival order, except that long jobs (max_tokens above
        Limits.short_tokens) may hold at most slots - 1 slots: the last one always serves short requests, so a
        short request waits for a short one at most, never for a long one to end."""
        engine = self.engine
        free = engine.slots - len(engine.active) - len(engine.waiting) - len(engine.preempted)
        while free > 0 and self.queue:
            long_held = sum(job.long for job in self.jobs.values())
            room_for_long = engine.slots == 1 or long_held < engine.slots - 1
            job = next((j for j in self.queue if room_for_long or not j.long), None)
            if job is None:
                return
            self.queue.remove(job)
            engine.add(job.seq, job.max_new, job.seed, params=job.ask.params, stop_ids=self.tokenizer.eog_ids,
                       draft_n=job.ask.draft_n)
            if job.seq.error is not None:  # checked before, so rare: the engine's own word
                self._refuse(job, BadRequest(job.seq.error, "prompt"))
                continue
            self.jobs[job.seq.index] = job
            free -= 1

    def _expire(self) -> None:
        """Jobs past their deadline end with a 504 (mid-stream: an error event), waiting or running."""
        now = time.perf_counter()
        late = [j for j in self.queue if now > j.deadline] + [j for j in self.jobs.values() if now > j.deadline]
        for job in late:
            error = BadRequest(f"the request ran past the server's limit of {self.limits.request_timeout_s:g} s "
                               "(serve --request-timeout)", status=504)
            job.gone = job.timed_out = True  # on_finish: no end event, not counted cancelled
            if job in self.queue:
                self.queue.remove(job)
            elif self.engine.cancel(job.seq):  # running: on_finish pops it; waiting in the engine: pop it here
                self.jobs.pop(job.seq.index, None)
            job.post(("error", error))
            self._count("timed_out")

    def _refuse(self, job: Job, error: BadRequest) -> None:
        job.post(("error", error))  # its route answers it
        self._count("refused")

    def _count(self, name: str) -> None:
        with self.lock:
            setattr(self.totals, name, getattr(self.totals, name) + 1)

    def _end_all(self, error: BadRequest) -> None:
        """Every job in flight ends with `error` (shutdown, or a failed step) and leaves the engine."""
        for job in list(self.jobs.values()) + list(self.queue):
            job.post(("error", error))
            job.gone = True  # a running one's on_finish counts it cancelled
            try:
                self.engine.cancel(job.seq)
            except Exception:  # after a failed step the engine's books may be off: the job is gone regardless
                pass
        with self.lock:
            self.totals.cancelled += len(self.queue) + len(self.jobs)  # queued, or left without an on_finish
        self.jobs.clear()
        self.queue.clear()
        self.stop_met.clear()
        self._count_queues()

    def _on_emit(self, seq: SeqResult, tokens: list[int], marks: list[str]) -> None:
        job = self.jobs[seq.index]
        if job.t_start is None:
            job.t_start = time.perf_counter()
            self._first_token(job.t_start - job.t_arrive)
        text = job.text.feed(text_ids(tokens, seq.stop_ids))
        if text:
            job.post(("text", text))
        if job.text.stopped and job not in self.stop_met:
            self.stop_met.append(job)

    def _first_token(self, seconds: float) -> None:
        with self.lock:
            t = self.totals
            t.ttft[next((i for i, b in enumerate(TTFT_BUCKETS) if seconds <= b), len(TTFT_BUCKETS))] += 1
            t.ttft_sum += seconds

    def _on_finish(self, seq: SeqResult) -> None:
        job = self.jobs.pop(seq.index, None)
        n, s = len(seq.tokens), seq.stats
        with self.lock:
            t = self.totals
            t.generated += n
            t.drafted += s.get("drafted", 0)
            t.accepted += s.get("accepted", 0)
            for i, (d, a) in enumerate(zip(s.get("drafted_at", ()), s.get("accepted_at", ()))):
                t.drafted_at[i] += d
                t.accepted_at[i] += a
            t.prompt_tokens += len(seq.prompt_tokens)
            if job is None or job.gone:
                t.cancelled += job is None or not job.timed_out
            else:
                t.requests += 1
        if job is None or job.gone:
            return
        tail = job.text.finish()
        if tail:
            job.post(("text", tail))
        stopped = job.text.stopped or (n > 0 and seq.tokens[-1] in seq.stop_ids)
        job.post(("end", "stop" if stopped or n < job.max_new else "length", n, self._stats(job)))

    def _stats(self, job: Job) -> dict:
        """The request's own speculation stats (the `tinyspec` object of its response)."""
        s = job.seq.stats
        now = time.perf_counter()
        return {"spec": self.spec, "seed": job.seed, "k_max": self.engine.k_max,
                **{k: s[k] for k in STATS_SHOWN if k in s},
                "tokens_per_step": s.get("mean_accepted_length", 0.0),
                "first_token_s": (job.t_start or now) - job.t_arrive, "wall_s": now - job.t_arrive}

    # ------------------------------------------------------------------------------------------ the HTTP side's calls

    def check_model(self, name: str | None) -> str:
        """The name a response carries: the one asked for if this server serves it (404 otherwise)."""
        if name is None:
            return self.model_name
        if name not in self.names:
            raise BadRequest(f"the model {name!r} is not served here (this server serves: {', '.join(self.names)}; "
                             "serve --served-model-name adds names)", "model", status=404)
        return name

    def encode(self, ask: Ask) -> list[int]:
        """The prompt's ids, refused (400) as soon as it cannot fit the context: Tokenizer.encode(limit=) refuses
        by the byte length before encoding where that decides, else stops one context in (a refused text costs
        at most a context's worth of work and leaves at most that in the tokenizer's cache). Called on a worker
        thread."""
        try:
            if isinstance(ask.prompt, str):
                with self.encoding:
                    tokens = self.tokenizer.encode(ask.prompt, limit=self.ctx)
            else:
                tokens = list(ask.prompt)
            if len(tokens) > self.ctx:
                raise TooManyTokens(self.ctx)
        except TooManyTokens:
            raise BadRequest(f"the prompt is more than {self.ctx} tokens: the server's context per request "
                             "(prompt and output)", "messages" if ask.chat else "prompt") from None
        return tokens

    def submit(self, ask: Ask, tokens: list[int], post: Callable[[tuple], None]) -> Job:
        """A checked Ask and its prompt's ids -> a Job on the inbox (BadRequest if it cannot run); its events go
        to post(event), called on the engine thread."""
        if self.closing.is_set():
            raise BadRequest("the server is shutting down", status=503)
        where, n, cap = "messages" if ask.chat else "prompt", len(tokens), self.limits.max_tokens
        max_new = ask.max_tokens
        if max_new is None:  # completions: OpenAI's 16; chat: up to the server's cap (the rest of the context)
            max_new = min(cap if ask.chat else DEFAULT_MAX_TOKENS, self.ctx - n)
        if n + max_new > self.ctx:
            raise BadRequest(f"a prompt of {n} tokens and max_tokens {max_new} exceed the server's context of "
                             f"{self.ctx} tokens per request: ask for at most {self.ctx - n}", "max_tokens")
        if max_new > cap:
            raise BadRequest(f"max_tokens {max_new} is more than this server's limit of {cap} (serve --max-tokens)",
                             "max_tokens")
        if why := check_prompt(self.model, tokens, max_new):  # empty, or ids outside the vocabulary
            raise BadRequest(why, where)
        if ask.draft_n is not None and not 0 <= ask.draft_n <= self.engine.k_max:
            raise BadRequest(f"tinyspec.draft_n must be in 0..{self.engine.k_max} (the server's k), got "
                             f"{ask.draft_n}", "tinyspec")
        seed = ask.seed if ask.seed is not None else secrets.randbits(63)
        now = time.perf_counter()
        job = Job(ask, SeqResult(next(self.ids), tokens), max_new, seed, TextStream(self.tokenizer, ask.stops), post,
                  now + self.limits.request_timeout_s, now, long=max_new > self.limits.short_tokens)
        self.inbox.put(("add", job))
        return job

    def cancel(self, job: Job) -> None:
        if not job.gone:
            job.gone = True
            self.inbox.put(("cancel", job))

    def refused(self) -> None:
        self._count("refused")

    def health(self) -> tuple[int, dict]:
        """(status, body): 503 while closing, when the engine thread has died, or when one step has run past
        Limits.stuck_after_s; 200 otherwise."""
        began = self.step_began
        status = ("closing" if self.closing.is_set() else
                  "engine thread stopped" if not self.engine_thread.is_alive() else
                  "engine stuck" if began is not None and time.perf_counter() - began > self.limits.stuck_after_s
                  else "ok")
        with self.lock:
            t = self.totals
            body = {"status": status, "slots": self.engine.slots, "slots_busy": t.running, "waiting": t.waiting}
        return (200 if status == "ok" else 503), body

    def models(self) -> dict:
        now = int(time.time())
        return {"object": "list", "data": [{"id": name, "object": "model", "created": now, "owned_by": "tinyspec",
                                            "context_length": self.ctx, "chat_template": self.chat is not None}
                                           for name in self.names]}

    def stats(self) -> dict:
        with self.lock:
            t = self.totals
            return {"requests": t.requests, "refused": t.refused, "cancelled": t.cancelled, "timed_out": t.timed_out,
                    "running": t.running, "waiting": t.waiting, "slots": self.engine.slots, "spec": self.spec,
                    "k_max": self.engine.k_max, "prompt_tokens": t.prompt_tokens, "generated": t.generated,
                    "steps": t.steps, "busy_s": t.busy_s, "tok_s": t.generated / t.busy_s if t.busy_s else 0.0,
                    "drafted": t.drafted, "accepted": t.accepted,
                    "acceptance_rate": t.accepted / t.drafted if t.drafted else 0.0,
                    "accepted_per_position": [a / d if d else 0.0 for a, d in zip(t.accepted_at, t.drafted_at)],
                    "prefix_hits": 0 if self.prefix_cache is None else self.prefix_cache.hits,
                    "preemptions": self.engine.preemptions}

    def metrics(self) -> str:
        """/metrics: the counts in Prometheus' text format (version 0.0.4), names prefixed tinyspec_."""
        with self.lock:
            t = replace(self.totals, drafted_at=list(self.totals.drafted_at), accepted_at=list(self.totals.accepted_at),
                        ttft=list(self.totals.ttft))
        hits = 0 if self.prefix_cache is None else self.prefix_cache.hits
        out = []

        def family(name: str, kind: str, help: str, samples: list[tuple[str, float]]) -> None:
            out.extend([f"# HELP tinyspec_{name} {help}", f"# TYPE tinyspec_{name} {kind}"])
            out.extend(f"tinyspec_{name}{labels} {value:g}" for labels, value in samples)

        family("requests_total", "counter", "Requests by how they ended.",
               [(f'{{outcome="{o}"}}', getattr(t, o)) for o in ("requests", "refused", "cancelled", "timed_out")])
        family("prompt_tokens_total", "counter", "Prompt tokens of requests that ran.", [("", t.prompt_tokens)])
        family("generation_tokens_total", "counter", "Tokens generated.", [("", t.generated)])
        family("draft_tokens_total", "counter", "Tokens drafted.", [("", t.drafted)])
        family("accepted_tokens_total", "counter", "Drafted tokens the target accepted.", [("", t.accepted)])
        family("draft_tokens_at_position_total", "counter", "Steps that drafted a token at this position.",
               [(f'{{position="{i + 1}"}}', d) for i, d in enumerate(t.drafted_at)])
        family("accepted_tokens_at_position_total", "counter", "Of which the draft at this position was accepted.",
               [(f'{{position="{i + 1}"}}', a) for i, a in enumerate(t.accepted_at)])
        family("engine_steps_total", "counter", "Verify passes.", [("", t.steps)])
        family("engine_busy_seconds_total", "counter", "Seconds the engine spent stepping.", [("", t.busy_s)])
        family("prefix_cache_hits_total", "counter", "Prompts that started from the prefix cache.", [("", hits)])
        family("preemptions_total", "counter", "Sequences that gave their KV blocks back.",
               [("", self.engine.preemptions)])
        family("requests_running", "gauge", "Requests in a slot.", [("", t.running)])
        family("requests_waiting", "gauge", "Requests waiting for a slot.", [("", t.waiting)])
        cumulative = list(itertools.accumulate(t.ttft))
        family("time_to_first_token_seconds", "histogram", "Arrival to first token.",
               [(f'_bucket{{le="{b:g}"}}', c) for b, c in zip(TTFT_BUCKETS, cumulative)]
               + [('_bucket{le="+Inf"}', cumulative[-1]), ("_sum", t.ttft_sum), ("_count", cumulative[-1])])
        return "\n".join(out) + "\n"
