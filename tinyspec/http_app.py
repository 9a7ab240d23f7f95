"""The HTTP side of `serve`: a Starlette app on uvicorn, in front of the engine thread (serve.py).

    client --HTTP--> uvicorn (one asyncio loop, h11) --> Starlette route --> worker thread: parse + encode
                                                              |                        |
                                                              |<-- job events <-- engine thread (serve.Server)
                                                              '--> JSON, or server-sent events

Why this stack: uvicorn + Starlette is what vLLM and SGLang stand on (through FastAPI). uvicorn's h11 protocol
parses HTTP/1.1 strictly (a bad request line, an HTTP/0.9 line, a Content-Length that is not ASCII digits, a
header block over 16 KB: a 400 with a status line, never a traceback or silence), keeps connections alive
correctly, and holds a connection in the event loop, not in a thread. Starlette routes, answers 404 and 405, and
reads bodies. FastAPI would add validation from type hints and OpenAPI pages; every request here is read under
limits before any validation runs (size, deadline, Content-Type, requests parsed at once), so the routes take the
raw body and validate it with the pydantic models themselves (openai_api.py): FastAPI would be one more layer
that the limits have to sit in front of.

What uvicorn does not do, done here:
- **a deadline on the request line and headers** (Limits.header_timeout_s): uvicorn's h11 protocol starts no
  timer before a request's headers are complete, and any byte resets its keep-alive timer, so a client sending a
  byte every few seconds (slowloris) would hold its connection forever. DeadlineProtocol arms a timer when the
  connection opens and after each response, which only complete headers disarm;
- **a cap on connections** (Limits.max_connections): past it a new connection gets a 503 and is closed at once;
- **a deadline on the body** (body_timeout_s, 408), **a cap on its size** (max_body, 413, refused from its
  Content-Length before a byte of it is read), **JSON Content-Type required** (415: a web page can send a
  cross-site "simple" POST only as text/plain or a form, never application/json), **bodies parsed at once**
  (parse_at_once: parsing inflates a body about tenfold), **a stall limit on writes** (write_timeout_s: a
  client that stops reading its stream is dropped);
- **an API key** (Limits.api_keys): `Authorization: Bearer KEY` on /v1/*, 401 otherwise (as llama-server and
  vLLM: /health and /metrics stay open);
- **cancellation**: a client that goes away (a disconnect while its answer is computed, or a failed write)
  cancels its job, whose slot and KV blocks serve the next request.

Every refusal is OpenAI's JSON error body, 4xx or 5xx, with the field at fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import socket
import threading
import time
import uuid

import h11
import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from .openai_api import BadRequest, completion_body, parse_request, usage

WRITE_TIMEOUT_S = 30.0  # a streamed chunk not taken by the client within this: the client is dropped
REFUSALS_PER_S = 20  # refusals answered a second at most; more wait their turn (HTTPFront.paced)
LINGER_S = 5.0  # how long a closed connection still reads (and drops) a body its client is sending (Lingering)
BODY_BYTES = 64 << 20  # bytes of request bodies held at once, read or waiting to be parsed (HTTPFront.body_room)
ENGINE_LOOK_S = 1.0  # how often a waiting handler looks whether the engine thread is still alive


def error_response(e: BadRequest, close: bool = False) -> JSONResponse:
    return JSONResponse(e.body(), e.status, headers={"Connection": "close"} if close else None)


def refuse(transport, status: int, phrase: str, message: str, close: bool = True) -> None:
    """A whole HTTP/1.1 error response written straight to a connection (then closed, unless close=False)."""
    body = json.dumps(BadRequest(message, status=status).body()).encode()
    transport.write(f"HTTP/1.1 {status} {phrase}\r\nContent-Type: application/json\r\nConnection: close\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    if close:
        transport.close()


class Lingering:
    """A connection's transport whose close() lingers while the client is still sending a body (a 413 sent from
    the Content-Length, a 408): the reply is sent and the write side shut, then what the client sends is read and
    dropped for up to LINGER_S (or the idle timeout, whichever comes first) before the socket closes. Closing a socket with unread bytes in it sends a reset,
    and a client still uploading a 30 MB body (http.client, the openai client) sees "connection reset" instead of
    the 413 (nginx lingers for the same reason). Everything else is the transport's own."""

    def __init__(self, transport, protocol: "DeadlineProtocol"):
        self.transport, self.protocol = transport, protocol

    def __getattr__(self, name: str):
        return getattr(self.transport, name)

    def close(self) -> None:
        p, t = self.protocol, self.transport
        if p.lingering or t.is_closing() or p.conn.their_state is not h11.SEND_BODY or not t.can_write_eof():
            return t.close()
        p.lingering = True
        t.write_eof()  # after the reply already queued
        t.resume_reading()
        p.loop.call_later(LINGER_S, t.close)


class DeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a header deadline and a connection cap (the module docstring: why)."""

    def __init__(self, *args, limits, **kwargs):
        super().__init__(*args, **kwargs)
        self.limits = limits  # serve.Limits

    def connection_made(self, transport) -> None:
        self.lingering = False  # answered and closing: see Lingering
        self.header_timer: asyncio.TimerHandle | None = None  # armed while a request's headers are awaited
        super().connection_made(Lingering(transport, self))
        self.refused = len(self.connections) > self.limits.max_connections
        if self.refused:  # answered at once; what the client sends is read and dropped until it closes
            refuse(transport, 503, "Service Unavailable", "too many connections: try again later", close=False)
            transport.write_eof()
            self.loop.call_later(self.limits.header_timeout_s, transport.close)
            return
        self.arm()

    def data_received(self, data: bytes) -> None:
        if not (self.refused or self.lingering):  # answered already: what comes is read and dropped
            super().data_received(data)

    def send_400_response(self, msg: str) -> None:
        """h11 could not parse the request (a bad request line, HTTP/0.9, a Content-Length that is not digits):
        uvicorn answers 400 in plain text; this answers it in OpenAI's JSON error shape, and closes. If this
        request was answered already (a 413 while its chunked body went on, malformed), it only closes."""
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            refuse(self.transport, 400, "Bad Request", f"malformed HTTP request: {msg}")
        else:
            self.transport.close()

    def arm(self) -> None:
        self.disarm()
        self.header_timer = self.loop.call_later(self.limits.header_timeout_s, self.headers_late)

    def disarm(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def headers_late(self) -> None:
        self.header_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and not self.cycle.response_complete:  # a request's headers are in
            self.disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request at once (its headers already in)
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self.arm()  # the next request's headers, on this kept-alive connection

    def connection_lost(self, exc) -> None:
        self.disarm()
        super().connection_lost(exc)


class LogTo(logging.Handler):
    """uvicorn's log records as lines for serve's own log (`serve --verbose`: stderr)."""

    def __init__(self, say):
        super().__init__()
        self.say = say

    def emit(self, record: logging.LogRecord) -> None:
        self.say(record.getMessage())


class HTTPFront:
    """The listening socket, the uvicorn server in its own thread, and the routes, for one serve.Server."""

    def __init__(self, server, host: str, port: int):
        self.server, self.limits = server, server.limits
        self.sock = socket.create_server((host, port), backlog=256)  # bound now: a taken port fails here
        self.host, self.port = self.sock.getsockname()[:2]
        self.url = f"http://{self.host}:{self.port}"
        self.parsing: asyncio.Semaphore | None = None  # made on the loop's thread
        self.next_refusal = 0.0  # the loop's clock: when the next refusal may be answered (paced)
        self.body_bytes = 0  # bytes of bodies held now (body_room)
        routes = [Route("/health", self.health), Route("/metrics", self.metrics),
                  Route("/v1/models", self.models), Route("/v1/stats", self.stats), Route("/stats", self.stats),
                  Route("/v1/completions", self.completions, methods=["POST"]),
                  Route("/v1/chat/completions", self.chat_completions, methods=["POST"])]
        self.app = Starlette(routes=routes, exception_handlers={HTTPException: self.http_error})
        protocol = functools.partial(DeadlineProtocol, limits=self.limits)  # uvicorn makes one per connection
        verbose = server.log is not None
        self.log_handlers = []  # (logger, handler): removed by stop()
        for name in ("uvicorn.error", "uvicorn.access"):  # uvicorn's own lines, through server.log, with --verbose
            logger = logging.getLogger(name)
            logger.setLevel(logging.INFO if verbose else logging.CRITICAL)
            if verbose:
                self.log_handlers.append((logger, LogTo(server.log)))
                logger.addHandler(self.log_handlers[-1][1])
        config = uvicorn.Config(self.app, http=protocol, lifespan="off", log_config=None, access_log=verbose,
                                timeout_keep_alive=self.limits.idle_timeout_s, timeout_graceful_shutdown=5.0,
                                limit_concurrency=None, server_header=False)
        self.uvicorn = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.uvicorn.run, kwargs={"sockets": [self.sock]},
                                       name="tinyspec-http", daemon=True)

    def start(self) -> None:
        self.thread.start()
        t_end = time.monotonic() + 30
        while not self.uvicorn.started and self.thread.is_alive() and time.monotonic() < t_end:
            time.sleep(0.01)

    def running(self) -> bool:
        return self.thread.is_alive()

    def stop(self, grace_s: float) -> None:
        self.uvicorn.config.timeout_graceful_shutdown = grace_s  # read by uvicorn's shutdown, after should_exit
        self.uvicorn.should_exit = True
        self.thread.join(timeout=grace_s + 2)
        self.sock.close()
        for logger, handler in self.log_handlers:
            logger.removeHandler(handler)

    # ------------------------------------------------------------------------------------------ the routes

    async def http_error(self, request: Request, e: HTTPException) -> JSONResponse:
        """Starlette's own refusals (no such path: 404; a GET on a POST endpoint: 405) in OpenAI's error shape."""
        what = f"{request.method} {request.url.path}"
        message = f"no such endpoint: {what}" if e.status_code == 404 else \
            f"{request.method} is not allowed on {request.url.path}" if e.status_code == 405 else str(e.detail)
        return JSONResponse(BadRequest(message, status=e.status_code).body(), e.status_code, headers=e.headers)

    async def health(self, request: Request) -> JSONResponse:
        status, body = self.server.health()
        return JSONResponse(body, status)

    async def metrics(self, request: Request) -> Response:
        return PlainTextResponse(self.server.metrics(), media_type="text/plain; version=0.0.4")

    async def models(self, request: Request) -> JSONResponse:
        if denied := self.authorized(request):
            return await self.paced(denied)
        return JSONResponse(self.server.models())

    async def stats(self, request: Request) -> JSONResponse:
        if denied := self.authorized(request):
            return await self.paced(denied)
        return JSONResponse(self.server.stats())

    async def paced(self, refusal: Response) -> Response:
        """A refusal, answered no sooner than 1 / REFUSALS_PER_S after the one before it. A client that sends
        bad requests as fast as they are answered (a flood, a key guessed) is slowed to that pace, so the event
        loop and the GIL stay with the requests that run; one refusal alone waits nothing."""
        loop = asyncio.get_running_loop()
        turn = max(self.next_refusal, loop.time())
        self.next_refusal = turn + 1 / REFUSALS_PER_S
        if turn > loop.time():
            await asyncio.sleep(turn - loop.time())
        return refusal

    def authorized(self, request: Request) -> JSONResponse | None:
        """None if the request may go on; a 401 if the server has keys and the request does not carry one."""
        keys = self.limits.api_keys
        if not keys:
            return None
        given = request.headers.get("authorization", "")
        token = given[7:].strip() if given[:7].lower() == "bearer " else ""
        if any(hmac.compare_digest(token.encode(), key.encode()) for key in keys):
            return None
        response = error_response(BadRequest("a valid API key is needed: Authorization: Bearer KEY", status=401))
        response.headers["WWW-Authenticate"] = "Bearer"
        return response

    async def completions(self, request: Request) -> Response:
        return await self.answer(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self.answer(request, chat=True)

    async def answer(self, request: Request, chat: bool) -> Response:
        server = self.server
        if denied := self.authorized(request):
            return await self.paced(denied)
        try:
            if chat and server.chat_unavailable:
                raise BadRequest(server.chat_unavailable, "messages", status=501)
            async with self.body_room(request):  # the bytes of bodies held at once are bounded
                raw = await self.read_body(request)
                if self.parsing is None:
                    self.parsing = asyncio.Semaphore(self.limits.parse_at_once)
                async with self.parsing:  # parsed, rendered and encoded on a worker thread, a few at a time
                    ask, model, tokens = await run_in_threadpool(self.prepare, raw, chat)
                    del raw
            events: asyncio.Queue = asyncio.Queue()
            loop = asyncio.get_running_loop()
            job = server.submit(ask, tokens, lambda event: post(loop, events, event))
        except BadRequest as e:  # the client's fault: counted and paced here
            server.refused()
            return await self.paced(error_response(e, close=e.status in (408, 411, 413, 415)))
        except ClientDisconnect:
            return Response(status_code=499)  # nobody to answer
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        gone = asyncio.ensure_future(wait_disconnect(request.receive))  # one watcher for the whole answer
        streaming = False  # the stream takes `gone` over
        try:
            # the first event before the headers: an error is still a plain 4xx / 5xx (the engine counted it)
            first = await next_event(events, gone, server.engine_thread)
            if first[0] == "error":
                return error_response(first[1])
            if ask.stream:
                streaming = True
                return EventStream(server, job, events, first, rid, model, gone)
            parts, event = [], first
            while event[0] == "text":
                parts.append(event[1])
                event = await next_event(events, gone, server.engine_thread)
        except ClientDisconnect:
            server.cancel(job)
            return Response(status_code=499)
        finally:
            if not streaming:
                gone.cancel()
        if event[0] == "error":
            return error_response(event[1])
        _, finish_reason, n, stats = event
        body = completion_body(ask, rid, int(time.time()), model, "".join(parts), finish_reason, chunk=False)
        body["usage"], body["tinyspec"] = usage(len(job.seq.prompt_tokens), n), stats
        return JSONResponse(body)

    def prepare(self, raw: bytes, chat: bool) -> tuple:
        """On a worker thread: the body parsed (pydantic), a chat rendered (Jinja), the model name checked and the
        prompt encoded; (Ask, the model name to answer with, the prompt's ids) or BadRequest."""
        server = self.server
        ask = parse_request(raw, chat, server.chat.render if server.chat else None)
        return ask, server.check_model(ask.model), server.encode(ask)

    @contextlib.asynccontextmanager
    async def body_room(self, request: Request):
        """Room for this request's body among the bodies held at once (BODY_BYTES in all, from Content-Length; a
        chunked body counts as max_body): past it, 503. Bodies wait for a parse slot after they are read, and
        without this the connection cap times max_body could sit in memory."""
        length = request.headers.get("content-length")
        need = min(int(length), self.limits.max_body) if length is not None else self.limits.max_body
        if self.body_bytes + need > BODY_BYTES:
            raise BadRequest("too many large request bodies at once: try again later", status=503)
        self.body_bytes += need
        try:
            yield
        finally:
            self.body_bytes -= need

    async def read_body(self, request: Request) -> bytes:
        """The body, under the limits: JSON Content-Type (415), a length (411), at most max_body bytes (413,
        refused from Content-Length before it is read), all of it within body_timeout_s (408)."""
        limits = self.limits
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":
            raise BadRequest(f"the body must be JSON with Content-Type: application/json (got {kind or 'none'!r})",
                             status=415)
        length = request.headers.get("content-length")
        if length is None and "chunked" not in request.headers.get("transfer-encoding", "").lower():
            raise BadRequest("a request body with a Content-Length is needed", status=411)
        if length is not None and int(length) > limits.max_body:  # h11 has checked it is ASCII digits
            raise BadRequest(f"the body is {int(length)} bytes: this server takes at most {limits.max_body} "
                             "(serve --max-body)", status=413)

        async def read() -> bytes:
            body = bytearray()
            async for chunk in request.stream():
                body += chunk
                if len(body) > limits.max_body:
                    raise BadRequest(f"the body is over {limits.max_body} bytes (serve --max-body)", status=413)
            return bytes(body)

        try:
            return await asyncio.wait_for(read(), limits.body_timeout_s)
        except asyncio.TimeoutError:
            raise BadRequest(f"the body did not arrive within {limits.body_timeout_s:g} s", status=408) from None


def post(loop: asyncio.AbstractEventLoop, events: asyncio.Queue, event: tuple) -> None:
    """An event from the engine thread into the loop's queue (nothing if the loop has closed: shutting down)."""
    try:
        loop.call_soon_threadsafe(events.put_nowait, event)
    except RuntimeError:
        pass


async def next_event(events: asyncio.Queue, gone: asyncio.Future, engine_thread: threading.Thread) -> tuple:
    """The job's next event; ClientDisconnect if the client goes away first (`gone`: the request's one
    wait_disconnect task; one per request, not per event, as each receive() lets the connection read more);
    a 503 error event if the engine thread has died (nobody would ever answer)."""
    if not events.empty():
        return events.get_nowait()
    get = asyncio.ensure_future(events.get())
    try:
        while not (done := (await asyncio.wait({get, gone}, timeout=ENGINE_LOOK_S,
                                                return_when=asyncio.FIRST_COMPLETED))[0]):
            if not engine_thread.is_alive():
                return "error", BadRequest("the engine thread has stopped: see the server's log", status=503)
    finally:
        get.cancel()
    if get in done:
        return get.result()
    raise ClientDisconnect()


async def wait_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class EventStream(Response):
    """A streamed answer: OpenAI's chunks as server-sent events, then `data: [DONE]`. Written by hand, not by
    Starlette's StreamingResponse, so a write the client does not take within WRITE_TIMEOUT_S drops the client,
    and a disconnect (or a failed write) cancels the job."""

    def __init__(self, server, job, events: asyncio.Queue, first: tuple, rid: str, model: str,
                 gone: asyncio.Future):
        super().__init__()
        self.gone = gone  # the request's disconnect watcher (next_event)
        self.raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
        self.server, self.job, self.events, self.first, self.rid, self.model = server, job, events, first, rid, model

    async def __call__(self, scope, receive, send) -> None:
        server, job, ask = self.server, self.job, self.job.ask
        try:
            await self.write(send, {"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            event, first = self.first, True
            while True:
                created = int(time.time())
                if event[0] == "text":
                    await self.chunk(send, completion_body(ask, self.rid, created, self.model, event[1], None, True,
                                                           first))
                    first = False
                elif event[0] == "error":
                    await self.chunk(send, event[1].body())
                    break
                else:
                    _, finish_reason, n, stats = event
                    last = completion_body(ask, self.rid, created, self.model, "", finish_reason, True, first)
                    last["tinyspec"] = stats
                    await self.chunk(send, last)
                    if ask.include_usage:
                        await self.chunk(send, {"id": self.rid, "object": last["object"], "created": created,
                                                "model": self.model, "choices": [],
                                                "usage": usage(len(job.seq.prompt_tokens), n)})
                    break
                event = await next_event(self.events, self.gone, server.engine_thread)
            await self.write(send, {"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
        except (ClientDisconnect, OSError, asyncio.TimeoutError):  # gone, or not reading: the job ends, its slot
            server.cancel(job)  # serves another
        finally:
            self.gone.cancel()

    async def chunk(self, send, body: dict) -> None:
        data = b"data: " + json.dumps(body).encode() + b"\n\n"
        await self.write(send, {"type": "http.response.body", "body": data, "more_body": True})

    @staticmethod
    async def write(send, message: dict) -> None:
        await asyncio.wait_for(send(message), WRITE_TIMEOUT_S)
