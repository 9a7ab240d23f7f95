"""`python -m tinyspec serve` (tinyspec/serve.py, openai_api.py): the OpenAI shape, exactness, and bad clients.

    openai     the official `openai` client: completions (greedy and seeded sampling), streaming, stop strings,
               chat on a file that carries a chat template, and a clear 400 for chat on one that does not
    exact      every answer's tokens equal its solo `generate` run (greedy; sampled with its seed, the same
               drafter and k), whatever else the engine is running, 100 requests at once included
    bad input  malformed JSON, unknown fields, wrong types, negative max_tokens, n = 2, a prompt over the
               context, an unknown path: a 4xx with a JSON error body, and the server still serves
    clients    a client that disconnects mid-stream is cancelled, its slot and KV blocks freed, the others
               unaffected; the CLI prints its URL, serves, and exits 0 on Ctrl-C, ending a running stream

The servers run in this process on a free loopback port (port 0), on the shipped tiny model and the numpy
oracle, and are closed by their fixtures; every client call has a timeout, so a bug cannot hang the suite.
"""

from __future__ import annotations

import functools
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import ASSETS, TIMEOUT, get, shown, target, wait_idle

import tinyspec
from tinyspec.backends import load_model
from tinyspec.generate import generate
from tinyspec.gguf import RawTensor, read_gguf, write_gguf
from tinyspec.mtp import MTPDrafter
from tinyspec.sampling import SamplingParams
from tinyspec.scheduler import EngineOptions
from tinyspec.serve import Server
from tinyspec.tokenizer import Tokenizer

openai = pytest.importorskip("openai")
pytest.importorskip("jinja2")

K = 3  # the MTP server's draft length (serve --draft-n)
TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@functools.cache
def solo(prompt: tuple[int, ...], max_new: int, temperature: float = 0.0, seed: int = 0, spec: str = "mtp") -> tuple:
    """What `generate --spec mtp --draft-n 3 --seed S --temperature T` gives this prompt alone (greedy: plain)."""
    model, tok = target()
    drafter = MTPDrafter(model) if spec == "mtp" and temperature > 0 else None
    result = generate(model, list(prompt), max_new, SamplingParams(temperature), np.random.default_rng(seed),
                      stop_ids=tok.eog_ids, drafter=drafter, draft_n=K if drafter else None)
    return tuple(result.tokens)


@pytest.fixture(scope="module")
def server():
    model, tok = target()
    srv = Server(model, tok, "tiny-target", EngineOptions(slots=4, chunk=16, prefix_cache=True),
                 drafter=MTPDrafter(model), spec="mtp", port=0).start()
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def chat_server(tmp_path_factory):
    """A server on the shipped model rewritten with a tokenizer.chat_template (plain decoding, 2 slots)."""
    path = tmp_path_factory.mktemp("serve") / "templated.gguf"
    with read_gguf(ASSETS / "tiny-target.gguf") as g:
        metadata = dict(g.fields) | {"tokenizer.chat_template": TEMPLATE}
        tensors = {t.name: RawTensor(t.ggml_type, t.shape, np.array(g.raw(t.name))) for t in g.tensors.values()}
    write_gguf(path, metadata, tensors)
    model = load_model(path, "numpy")
    srv = Server(model, Tokenizer.from_gguf(model.metadata), "templated", EngineOptions(slots=2), port=0).start()
    yield srv
    srv.close()


def client(srv: Server):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="x", timeout=TIMEOUT, max_retries=0)


def post(srv: Server, path: str, body=None, raw: bytes | None = None) -> tuple[int, dict]:
    """A raw HTTP POST: (status, JSON body)."""
    conn = http.client.HTTPConnection(srv.host, srv.port, timeout=TIMEOUT)
    try:
        conn.request("POST", path, raw if raw is not None else json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


# ------------------------------------------------------------------------------------------ the openai client

def test_completion_with_the_openai_client_equals_generate(server):
    _, tok = target()
    prompt = "def main("
    ids = tuple(tok.encode(prompt))
    out = client(server).completions.create(model="tiny-target", prompt=prompt, max_tokens=12, temperature=0)
    assert out.choices[0].text == shown(solo(ids, 12))
    assert out.usage.completion_tokens == len(solo(ids, 12)) and out.usage.prompt_tokens == len(ids)
    assert out.choices[0].finish_reason == "length"
    stats = out.model_extra["tinyspec"]
    assert stats["spec"] == "mtp" and stats["k_max"] == K and stats["drafted"] > 0
    assert 0 <= stats["acceptance_rate"] <= 1 and stats["tokens_per_step"] >= 1


@pytest.mark.parametrize("seed", [0, 7, 12345])
def test_a_seeded_sampled_completion_equals_generate_with_that_seed(server, seed):
    _, tok = target()
    ids = [int(t) for t in tok.encode("import numpy as np\n")]
    out = client(server).completions.create(model="tiny-target", prompt=ids, max_tokens=10, temperature=0.9,
                                            seed=seed)
    assert out.choices[0].text == shown(solo(tuple(ids), 10, 0.9, seed))
    assert out.model_extra["tinyspec"]["seed"] == seed


def test_streaming_gives_the_same_text_in_chunks_then_the_stats(server):
    _, tok = target()
    ids = tuple(tok.encode("class Foo:"))
    chunks = list(client(server).completions.create(model="tiny-target", prompt="class Foo:", max_tokens=14,
                                                    temperature=0, stream=True,
                                                    stream_options={"include_usage": True}))
    text_chunks = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in text_chunks) == shown(solo(ids, 14))
    assert len(text_chunks) > 2  # really streamed, not one piece
    assert [c.choices[0].finish_reason for c in text_chunks][-1] == "length"
    assert text_chunks[-1].model_extra["tinyspec"]["steps"] >= 1
    assert chunks[-1].usage.completion_tokens == 14


def test_a_stop_string_cuts_the_text_and_ends_the_request(server):
    _, tok = target()
    ids = tuple(tok.encode("def main("))
    full = shown(solo(ids, 24))
    stop = full[5:9]  # a piece of the greedy text: the answer ends just before its first occurrence
    out = client(server).completions.create(model="tiny-target", prompt="def main(", max_tokens=24, temperature=0,
                                            stop=[stop])
    assert out.choices[0].text == full[: full.index(stop)] and out.choices[0].finish_reason == "stop"
    streamed = client(server).completions.create(model="tiny-target", prompt="def main(", max_tokens=24,
                                                 temperature=0, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == full[: full.index(stop)]
    assert wait_idle(server)["slots_busy"] == 0


def test_chat_renders_the_files_template_and_equals_generate(chat_server):
    model, tok = target()
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "a loop"}]
    rendered = "<|system|>You write Python.\n<|user|>a loop\n<|assistant|>"  # TEMPLATE by hand
    expected = shown(solo(tuple(tok.encode(rendered)), 9, spec="none"))
    c = client(chat_server)
    out = c.chat.completions.create(model="templated", messages=messages, max_tokens=9, temperature=0)
    assert out.choices[0].message.role == "assistant" and out.choices[0].message.content == expected
    assert out.usage.prompt_tokens == len(tok.encode(rendered))
    chunks = list(c.chat.completions.create(model="templated", messages=messages, max_tokens=9, temperature=0,
                                            stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == expected
    assert get(chat_server, "/v1/models")["data"][0]["chat_template"] is True


def test_chat_without_a_template_is_a_clear_400(server):
    with pytest.raises(openai.BadRequestError, match="no chat template"):
        client(server).chat.completions.create(model="tiny-target", messages=[{"role": "user", "content": "hi"}])


def test_models_health_and_stats(server):
    models = client(server).models.list()
    assert [m.id for m in models.data] == ["tiny-target"]
    health = get(server, "/health")
    assert health["status"] == "ok" and health["slots"] == 4
    stats = get(server, "/v1/stats")
    assert {"requests", "generated", "tok_s", "acceptance_rate", "prefix_hits", "preemptions"} <= set(stats)
    assert stats["prefix_hits"] == 0 and stats["preemptions"] == 0


# ------------------------------------------------------------------------------------------ bad requests

BAD = {  # name -> (raw body, the status, a piece of the message, the param)
    "malformed JSON": (b'{"prompt": "x",', 400, "malformed JSON", None),
    "JSON nested too deeply": (b"[" * 100_000 + b"]" * 100_000, 400, "nested too deeply", None),
    "not an object": (b'["x"]', 400, "JSON object", None),
    "unknown field": (b'{"prompt": "x", "max_token": 3}', 400, "unknown field 'max_token'", "max_token"),
    "negative max_tokens": (b'{"prompt": "x", "max_tokens": -1}', 400, "max_tokens", "max_tokens"),
    "max_tokens not a number": (b'{"prompt": "x", "max_tokens": "5"}', 400, "max_tokens", "max_tokens"),
    "temperature a bool": (b'{"prompt": "x", "temperature": true}', 400, "temperature", "temperature"),
    "temperature infinite": (b'{"prompt": "x", "temperature": Infinity}', 400, "temperature", "temperature"),
    "top_p zero": (b'{"prompt": "x", "top_p": 0}', 400, "top_p", "top_p"),
    "n = 2": (b'{"prompt": "x", "n": 2}', 400, "n must be 1", "n"),
    "no prompt": (b'{"max_tokens": 3}', 400, "prompt is missing", "prompt"),
    "empty prompt": (b'{"prompt": ""}', 400, "empty", "prompt"),
    "two prompts": (b'{"prompt": ["a", "b"]}', 400, "one prompt", "prompt"),
    "id outside the vocabulary": (b'{"prompt": [1, 99999]}', 400, "outside the vocabulary", "prompt"),
    "prompt ids over the context": (json.dumps({"prompt": [5] * 5000}).encode(), 400, "context", "prompt"),
    "prompt text over the context": (json.dumps({"prompt": "x" * 20000 * 8}).encode(), 400, "context", "prompt"),
    "max_tokens over the context": (b'{"prompt": "x", "max_tokens": 5000}', 400, "context", "max_tokens"),
    "logprobs": (b'{"prompt": "x", "logprobs": 2}', 400, "logprobs", "logprobs"),
    "a bad stop": (b'{"prompt": "x", "stop": [""]}', 400, "stop", "stop"),
    "a negative seed": (b'{"prompt": "x", "seed": -3}', 400, "seed", "seed"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_request_is_a_4xx_with_a_json_error_and_the_server_goes_on(server, name):
    raw, status, message, param = BAD[name]
    got, body = post(server, "/v1/completions", raw=raw)
    assert got == status and message in body["error"]["message"] and body["error"]["param"] == param, body
    ok, answer = post(server, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0})
    assert ok == 200 and answer["usage"]["completion_tokens"] == 2


def raw_exchange(srv: Server, data: bytes) -> tuple[int, dict]:
    """Bytes in, (status, JSON error body) out, for requests no HTTP client would send."""
    with socket.create_connection((srv.host, srv.port), timeout=TIMEOUT) as sock:
        sock.sendall(data)
        reply = b""
        while more := sock.recv(4096):
            reply += more
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_unknown_paths_and_a_body_without_length_are_refused(server):
    assert post(server, "/v1/embeddings", {"input": "x"})[0] == 404
    assert "error" in get(server, "/v2/nothing")
    status, body = raw_exchange(server, b"NOT A REQUEST LINE HTTP/1.1\r\n\r\n")  # five words, not three
    assert status == 400 and body["error"]["message"]
    status, body = raw_exchange(server, b"DELETE /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status == 405 and "DELETE" in body["error"]["message"]
    conn = http.client.HTTPConnection(server.host, server.port, timeout=TIMEOUT)
    conn.putrequest("POST", "/v1/completions")
    conn.putheader("Content-Type", "application/json")
    conn.endheaders()  # no body, no Content-Length
    response = conn.getresponse()
    assert response.status == 411 and "Content-Length" in json.loads(response.read())["error"]["message"]
    conn.close()


# ------------------------------------------------------------------------------------------ clients

def test_a_client_that_leaves_mid_stream_is_cancelled_and_the_others_are_exact(server):
    """The leaver asks for 400 tokens, reads two chunks and closes its socket; a request running beside it
    still gets exactly its solo tokens, and the leaver's slot and KV blocks come back."""
    _, tok = target()
    wait_idle(server)
    cancelled_before = get(server, "/v1/stats")["cancelled"]
    sock = socket.create_connection((server.host, server.port), timeout=TIMEOUT)
    body = json.dumps({"prompt": "import os\n", "max_tokens": 400, "temperature": 0, "stream": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    seen = b""
    while seen.count(b"data: ") < 2:
        more = sock.recv(4096)
        assert more, seen
        seen += more
    other = {}
    thread = threading.Thread(target=lambda: other.update(out=post(server, "/v1/completions", {
        "prompt": "def f(x):", "max_tokens": 20, "temperature": 0.8, "seed": 3})))
    thread.start()
    sock.close()
    thread.join(TIMEOUT)
    status, answer = other["out"]
    assert status == 200
    assert answer["choices"][0]["text"] == shown(solo(tuple(tok.encode("def f(x):")), 20, 0.8, 3))
    wait_idle(server)
    assert get(server, "/v1/stats")["cancelled"] == cancelled_before + 1
    assert server.engine.pool.used == 0


def test_100_requests_at_once_are_all_answered_each_as_alone(server):
    _, tok = target()
    # 20 different requests, 5 of each: greedy and seeded sampled ones, sharing passes in any mix
    asks = [([1 + b % 7, 2 + b % 5, 40 + b % 3], 0.0 if b % 2 else 0.9, b % 10) for b in (i % 20 for i in range(100))]
    results: list = [None] * len(asks)

    def one(i: int) -> None:
        prompt, temperature, seed = asks[i]
        results[i] = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 3, "temperature": temperature,
                                                      "seed": seed})

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(asks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT * 2)
    for (prompt, temperature, seed), (status, body) in zip(asks, results):
        assert status == 200, body
        assert body["choices"][0]["text"] == shown(solo(tuple(prompt), 3, temperature, seed))
    wait_idle(server)
    assert server.engine.pool.used == 0


def test_the_cli_prints_its_url_serves_and_exits_cleanly_on_ctrl_c():
    env = os.environ | {"PYTHONPATH": str(Path(tinyspec.__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "tinyspec", "serve", "--port", "0", "--backend", "numpy",
                             "--slots", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()  # "tinyspec serve: listening on http://127.0.0.1:PORT (...)"
        assert "listening on http://127.0.0.1:" in line, line + proc.stderr.read()
        port = int(line.split("http://127.0.0.1:")[1].split()[0])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
        conn.request("GET", "/health")
        assert json.loads(conn.getresponse().read())["status"] == "ok"
        conn.request("POST", "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 1000, "stream": True}),
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200 and response.readline().startswith(b"data: ")
        proc.send_signal(signal.SIGINT)
        rest = response.read().decode()  # the stream ends with an error event and [DONE]
        assert "shutting down" in rest and rest.rstrip().endswith("data: [DONE]")
        assert proc.wait(TIMEOUT) == 0
        assert "stopped" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_prompts_sharing_a_prefix_hit_the_prefix_cache_and_still_equal_generate(server):
    """The module's server runs with --prefix-cache and --chunk 16: a prompt that starts like an earlier one
    starts from the cached blocks and saved GDN state, prefills only the rest, and gets its solo tokens."""
    _, tok = target()
    shared = "import os\nimport sys\n\n\ndef main(argv):\n    parser = make_parser()\n    args = parser.parse_args(argv)\n"
    hits_before = get(server, "/v1/stats")["prefix_hits"]
    for tail in ("    return 0\n", "    print(args)\n", "    if args.verbose:\n"):
        ids = tuple(tok.encode(shared + tail))
        out = client(server).completions.create(model="tiny-target", prompt=list(ids), max_tokens=8, temperature=0)
        assert out.choices[0].text == shown(solo(ids, 8))
    stats = get(server, "/v1/stats")
    assert stats["prefix_hits"] >= hits_before + 2 and stats["preemptions"] >= 0
    assert server.prefix_cache is not None and server.engine.chunk == 16


def test_a_client_that_leaves_while_waiting_for_a_whole_answer_is_cancelled(server):
    """Not streamed, nothing is written until the end: the handler sees the closed socket while it waits."""
    wait_idle(server)
    cancelled_before = get(server, "/v1/stats")["cancelled"]
    sock = socket.create_connection((server.host, server.port), timeout=TIMEOUT)
    body = json.dumps({"prompt": "import os\n", "max_tokens": 400, "temperature": 0}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    t_end = time.monotonic() + TIMEOUT
    while get(server, "/health")["slots_busy"] == 0:  # running
        assert time.monotonic() < t_end
        time.sleep(0.02)
    sock.close()
    wait_idle(server)
    assert get(server, "/v1/stats")["cancelled"] == cancelled_before + 1
    assert server.engine.pool.used == 0


def test_bad_chat_requests_and_templates_are_named(chat_server):
    from tinyspec.openai_api import BadRequest, ChatTemplate

    for body, message in (({"messages": []}, "non-empty list"),
                          ({"messages": [{"role": "user"}]}, "content must be a text"),
                          ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "unknown field"),
                          ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "prompt": "x"},
                           "unknown field 'prompt'")):
        status, answer = post(chat_server, "/v1/chat/completions", body)
        assert status == 400 and message in answer["error"]["message"], answer
    with pytest.raises(ValueError, match="does not parse"):
        ChatTemplate("{% for m in messages %}")
    strict = ChatTemplate("{% if messages[0].role != 'user' %}{{ raise_exception('users first') }}{% endif %}x")
    assert strict.render([{"role": "user", "content": "hi"}]) == "x"
    with pytest.raises(BadRequest, match="users first"):
        strict.render([{"role": "system", "content": "hi"}])


def test_a_seeded_request_gets_what_the_generate_command_prints_for_that_seed(server):
    """The claim in its user's words: `generate --spec mtp --draft-n 3 --seed S --temperature T` (the server runs
    --spec mtp with k = 3) prints the text the server answers for that prompt, seed and temperature."""
    env = os.environ | {"PYTHONPATH": str(Path(tinyspec.__file__).resolve().parents[1])}
    run = subprocess.run([sys.executable, "-m", "tinyspec", "generate", "--prompt", "def f(x):", "--spec", "mtp",
                          "--draft-n", str(K), "--seed", "5", "--temperature", "0.8", "--max-new", "12", "--backend",
                          "numpy", "--json"], capture_output=True, text=True, timeout=TIMEOUT, env=env)
    assert run.returncode == 0, run.stderr
    out = client(server).completions.create(model="tiny-target", prompt="def f(x):", max_tokens=12, temperature=0.8,
                                            seed=5)
    assert out.choices[0].text == json.loads(run.stdout)["text"]
