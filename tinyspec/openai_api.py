"""The OpenAI request and response shapes the server speaks (serve.py): parsing, checking, rendering a chat.

    POST /v1/completions        {"prompt": TEXT | [ids], "max_tokens", "temperature", "top_p", "top_k", "seed",
                                 "stop": TEXT | [TEXT], "stream", "stream_options": {"include_usage"}, "n": 1,
                                 "model", "user"}
    POST /v1/chat/completions   the same with "messages": [{"role", "content"}] instead of "prompt" (and
                                 "max_completion_tokens" as another name for max_tokens); the messages are
                                 rendered to a prompt by the file's chat template (tokenizer.chat_template)

A request is checked strictly before it reaches the engine: a field this server does not know is refused by name
(a client misspelling "max_token" should hear so, not get 16 tokens), and so is a known field it does not
implement (n > 1, logprobs, penalties). Every refusal is a BadRequest: an HTTP status, one line, and the field
(OpenAI's error body {"error": {"message", "type", "param", "code"}}).

Chat templates are Jinja2, rendered the way transformers' apply_chat_template and llama.cpp's minja do: a
sandboxed environment with trim_blocks and lstrip_blocks, loop controls, `raise_exception`, `strftime_now`, a
`tojson` that keeps non-ASCII text, and the variables messages, add_generation_prompt = true, bos_token and
eos_token. The rendered text is encoded with special tokens parsed (as transformers does with
add_special_tokens = False: the template writes any BOS itself).

Does NOT include: several prompts or choices per request, logprobs, echo, suffix, penalties, logit_bias, tools,
response_format (each refused with a 400 naming it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .sampling import SamplingParams

MAX_STOPS = 4  # stop strings per request (OpenAI's limit)
DEFAULT_MAX_TOKENS = 16  # /v1/completions without max_tokens (OpenAI's default); chat: the rest of the context

# fields OpenAI defines that this server does not implement: refused by name, with why
UNSUPPORTED = {
    "logprobs": "logprobs are not returned", "top_logprobs": "logprobs are not returned",
    "echo": "echo is not supported", "suffix": "suffix (insertion) is not supported",
    "best_of": "best_of is not supported", "logit_bias": "logit_bias is not supported",
    "presence_penalty": "penalties are not supported", "frequency_penalty": "penalties are not supported",
    "tools": "tools are not supported", "tool_choice": "tools are not supported",
    "functions": "tools are not supported", "function_call": "tools are not supported",
    "response_format": "response_format is not supported", "parallel_tool_calls": "tools are not supported",
}
COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "stream_options", "n",
          "user"}
COMPLETION_FIELDS = COMMON | {"prompt"}
CHAT_FIELDS = COMMON | {"messages", "max_completion_tokens"}
MESSAGE_FIELDS = {"role", "content", "name"}


class BadRequest(Exception):
    """A request the server refuses: status (4xx, or 503 while shutting down), one line, and the field at fault."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.status, self.param = status, param

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": None}}


@dataclass(frozen=True)
class Ask:
    """One checked request: what the engine thread needs, nothing of HTTP. prompt: text (encoded by the server)
    or token ids; max_tokens None: the endpoint's default."""
    chat: bool  # /v1/chat/completions (the prompt is the rendered messages)
    prompt: str | list[int]
    max_tokens: int | None
    params: SamplingParams
    seed: int | None  # None: a fresh one (reported in the response, so the output can be had again)
    stops: tuple[str, ...]
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the usage
    model: str | None


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # JSON true is not a number


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def parse_request(body, chat: bool, render_chat=None) -> Ask:
    """The JSON body of a completion (chat=False) or chat request -> an Ask, or BadRequest naming the field.
    render_chat(messages) -> prompt text: the file's chat template (serve.py; None: the file has none)."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    known = CHAT_FIELDS if chat else COMPLETION_FIELDS
    for name in body:
        if name in UNSUPPORTED and body[name] not in (None, False, 0):
            raise BadRequest(f"{name}: {UNSUPPORTED[name]} by this server", name)
        if name not in known and name not in UNSUPPORTED:
            raise BadRequest(f"unknown field {name!r} (this endpoint takes {', '.join(sorted(known))})", name)
    if chat:
        prompt = chat_prompt(body.get("messages"), render_chat)
    else:
        prompt = completion_prompt(body.get("prompt"))
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("model must be a string", "model")
    n = body.get("n", 1)
    if n is not None and n != 1:
        raise BadRequest(f"n must be 1 (one choice per request), got {n!r}", "n")
    max_tokens = body.get("max_tokens")
    if chat and body.get("max_completion_tokens") is not None:
        if max_tokens is not None:
            raise BadRequest("give max_tokens or max_completion_tokens, not both", "max_completion_tokens")
        max_tokens = body["max_completion_tokens"]
    if max_tokens is not None and (not is_int(max_tokens) or max_tokens < 0):
        raise BadRequest(f"max_tokens must be an integer >= 0, got {max_tokens!r}", "max_tokens")
    params = sampling(body)
    seed = body.get("seed")
    if seed is not None and (not is_int(seed) or seed < 0 or seed >= 2**63):
        raise BadRequest(f"seed must be an integer in 0 .. 2^63 - 1, got {seed!r}", "seed")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest(f"stream must be true or false, got {stream!r}", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or set(options) - {"include_usage"} or \
            not isinstance(options.get("include_usage", False), bool):
        raise BadRequest('stream_options must be {"include_usage": true | false}', "stream_options")
    return Ask(chat, prompt, max_tokens, params, seed, stop_strings(body.get("stop")), bool(stream),
               bool(options.get("include_usage")), model)


def completion_prompt(prompt) -> str | list[int]:
    """A completion's prompt: one text, or one list of token ids (a list of one text is that text)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise BadRequest("prompt is empty: give at least one character or token id", "prompt")
        return prompt
    if isinstance(prompt, list) and prompt and all(is_int(t) for t in prompt):
        return prompt  # ids are checked against the vocabulary by the engine's check_prompt
    if prompt is None:
        raise BadRequest("prompt is missing: give a text or a list of token ids", "prompt")
    raise BadRequest("prompt must be one text or one non-empty list of token ids (one prompt per request)",
                     "prompt")


def chat_prompt(messages, render_chat) -> str:
    """A chat's messages, checked, rendered by the file's template."""
    if render_chat is None:
        raise BadRequest("this model file has no chat template (tokenizer.chat_template): use /v1/completions "
                         "with a prompt", "messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of {\"role\", \"content\"} objects", "messages")
    checked = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"{where} must be an object with a \"role\" text", where)
        if extra := set(m) - MESSAGE_FIELDS:
            raise BadRequest(f"{where}: unknown field {sorted(extra)[0]!r} (a message takes role, content, name)",
                             where)
        content = m.get("content")
        if isinstance(content, list):  # content parts: only text ones
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise BadRequest(f"{where}.content: only text parts ({{\"type\": \"text\", \"text\": ...}})", where)
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise BadRequest(f"{where}.content must be a text", where)
        checked.append({**m, "content": content})
    return render_chat(checked)


def sampling(body: dict) -> SamplingParams:
    temperature, top_p, top_k = body.get("temperature", 1.0), body.get("top_p", 1.0), body.get("top_k", 0)
    temperature = 1.0 if temperature is None else temperature
    top_p = 1.0 if top_p is None else top_p
    top_k = 0 if top_k is None else top_k
    if not is_number(temperature) or not (math.isfinite(temperature) and temperature >= 0):  # JSON may say Infinity
        raise BadRequest(f"temperature must be a number >= 0 (0: greedy), got {temperature!r}", "temperature")
    if not is_number(top_p) or not 0 < top_p <= 1:
        raise BadRequest(f"top_p must be a number in (0, 1], got {top_p!r}", "top_p")
    if not is_int(top_k) or top_k < 0:
        raise BadRequest(f"top_k must be an integer >= 0 (0: off), got {top_k!r}", "top_k")
    return SamplingParams(float(temperature), top_k, float(top_p))


def stop_strings(stop) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOPS:
        raise BadRequest(f"stop must be a non-empty text or a list of at most {MAX_STOPS} of them", "stop")
    return tuple(stops)


class ChatTemplate:
    """The file's tokenizer.chat_template, compiled once (the module docstring: how it is rendered)."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        try:
            import jinja2
            import jinja2.ext
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise ValueError("the file has a chat template and rendering it needs jinja2: pip install "
                             "'tinyspec[serve]'") from None
        import datetime
        import json

        def raise_exception(message):
            raise jinja2.TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False: json.dumps(
            x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
        self.errors = (jinja2.TemplateError,)
        try:
            self.template = env.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ValueError(f"the file's chat template does not parse: {e.message} (line {e.lineno})") from None
        self.bos_token, self.eos_token = bos_token, eos_token

    def render(self, messages: list[dict]) -> str:
        try:
            return self.template.render(messages=messages, add_generation_prompt=True, bos_token=self.bos_token,
                                        eos_token=self.eos_token)
        except self.errors as e:
            raise BadRequest(f"the chat template refused these messages: {e}", "messages") from None


# ------------------------------------------------------------------------------------------ responses

def completion_body(ask: Ask, rid: str, created: int, model: str, text: str | None, finish_reason: str | None,
                    chunk: bool, first: bool = False) -> dict:
    """One response (chunk=False: the whole text) or one streamed chunk of it (text: its new text), in the
    endpoint's shape: text_completion, or chat.completion(.chunk) with a message or a delta."""
    if not ask.chat:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice]}
    if chunk:
        delta = ({"role": "assistant"} if first else {}) | ({"content": text} if text else {})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [choice]}
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
              "finish_reason": finish_reason}
    return {"id": rid, "object": "chat.completion", "created": created, "model": model, "choices": [choice]}


def usage(n_prompt: int, n_generated: int) -> dict:
    return {"prompt_tokens": n_prompt, "completion_tokens": n_generated, "total_tokens": n_prompt + n_generated}
