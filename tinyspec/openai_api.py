"""The OpenAI request and response shapes the server speaks (serve.py): parsing, checking, rendering a chat.

    POST /v1/completions        {"prompt": TEXT | [ids], "max_tokens", "temperature", "top_p", "top_k", "seed",
                                 "stop": TEXT | [TEXT], "stream", "stream_options": {"include_usage"}, "n": 1,
                                 "model", "user", "tinyspec": {"draft_n"}}
    POST /v1/chat/completions   the same with "messages": [{"role", "content"}] instead of "prompt" (and
                                 "max_completion_tokens" as another name for max_tokens); the messages are
                                 rendered to a prompt by the file's chat template (tokenizer.chat_template)

The request shapes are pydantic models (CompletionRequest, ChatRequest), as vLLM's protocol module has them,
in strict mode, parsed straight from the body's bytes. A request is checked strictly before it reaches the
engine: a field this server does not know is refused by name (a client misspelling "max_token" should hear so,
not get 16 tokens), and so is a known field it does not implement (n > 1, logprobs, penalties). Every refusal is
a BadRequest: an HTTP status, one line, and the field (OpenAI's error body {"error": {"message", "type", "param",
"code"}}). One field is ours: "tinyspec": {"draft_n": k} caps this request's drafts per step (0: plain decoding).

Chat templates are Jinja2, rendered the way transformers' apply_chat_template and llama.cpp's minja do: a
sandboxed environment with trim_blocks and lstrip_blocks, loop controls, `raise_exception`, `strftime_now`, a
`tojson` that keeps non-ASCII text, and the variables messages, add_generation_prompt = true, bos_token and
eos_token. The rendered text is encoded with special tokens parsed (as transformers does with
add_special_tokens = False: the template writes any BOS itself).

Does NOT include: several prompts or choices per request, logprobs, echo, suffix, penalties, logit_bias, tools,
response_format (each refused with a 400 naming it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .sampling import SamplingParams
from .textstream import MAX_STOP_CHARS

MAX_STOPS = 4  # stop strings per request (OpenAI's limit)
DEFAULT_MAX_TOKENS = 16  # /v1/completions without max_tokens (OpenAI's default); chat: up to the server's cap

# fields OpenAI defines that this server does not implement: refused by name (unless null, false or 0), with why
UNSUPPORTED = {
    "logprobs": "logprobs are not returned", "top_logprobs": "logprobs are not returned",
    "echo": "echo is not supported", "suffix": "suffix (insertion) is not supported",
    "best_of": "best_of is not supported", "logit_bias": "logit_bias is not supported",
    "presence_penalty": "penalties are not supported", "frequency_penalty": "penalties are not supported",
    "tools": "tools are not supported", "tool_choice": "tools are not supported",
    "functions": "tools are not supported", "function_call": "tools are not supported",
    "response_format": "response_format is not supported", "parallel_tool_calls": "tools are not supported",
}
# what each field must be, for the refusal's one line (pydantic's own words name types, not meanings)
MUST = {
    "model": "a text", "max_tokens": "an integer >= 0", "max_completion_tokens": "an integer >= 0",
    "temperature": "a number >= 0 (0: greedy)", "top_p": "a number in (0, 1]", "top_k": "an integer >= 0 (0: off)",
    "seed": "an integer in 0 .. 2^63 - 1", "stream": "true or false", "n": "1 (one choice per request)",
    "stream_options": 'an object {"include_usage": true | false}', "user": "a text",
    "stop": f"a non-empty text or a list of at most {MAX_STOPS} of them, each at most {MAX_STOP_CHARS} characters",
    "prompt": "one text or one non-empty list of token ids (one prompt per request)",
    "messages": 'a non-empty list of {"role", "content"} objects (content: a text, or text parts)',
    "tinyspec": '{"draft_n": an integer >= 0} (drafts per step for this request; 0: no speculation)',
}


TYPE_NAME = re.compile(r"^(str|int|float|bool|[A-Z]\w*)$|[\[|]")  # pydantic's names of a union's members, in a loc


class BadRequest(Exception):
    """A request the server refuses: status (4xx, or 503 while shutting down), one line, and the field at fault."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.status, self.param = status, param

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": None}}


# ------------------------------------------------------------------------------------------ the request shapes

class Strict(BaseModel):
    """JSON as typed: no field it does not name, no "5" for 5, no true for 1 (pydantic's strict mode)."""
    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(Strict):
    type: Literal["text"]
    text: str


class Message(Strict):
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None


class StreamOptions(Strict):
    include_usage: bool = False


class SpecOptions(Strict):
    """Per request speculation: drafts per step at most (0: this request decodes plainly); the server's k caps it."""
    draft_n: int | None = Field(None, ge=0)


class CommonRequest(Strict):
    """The fields /v1/completions and /v1/chat/completions share (OpenAI's names and defaults)."""
    model: str | None = None
    max_tokens: int | None = Field(None, ge=0)
    temperature: float | None = Field(None, ge=0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=0)
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(1, ge=1, le=1)
    user: str | None = None
    tinyspec: SpecOptions | None = None
    # known to OpenAI, not implemented here: accepted only as null / false / 0 (UNSUPPORTED says why)
    logprobs: Any = None
    top_logprobs: Any = None
    echo: Any = None
    suffix: Any = None
    best_of: Any = None
    logit_bias: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    response_format: Any = None
    parallel_tool_calls: Any = None


class CompletionRequest(CommonRequest):
    prompt: str | list[int] | list[str | list[int]] | None = None


class ChatRequest(CommonRequest):
    messages: list[Message] | None = None
    max_completion_tokens: int | None = Field(None, ge=0)


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
    draft_n: int | None = None  # tinyspec.draft_n: this request's drafts per step at most (None: the server's)


def parse_request(raw: bytes, chat: bool, render_chat=None) -> Ask:
    """A request body (JSON bytes) of a completion (chat=False) or chat request -> an Ask, or BadRequest naming
    the field. render_chat(messages) -> prompt text: the file's chat template (serve.py; None: the file has none).
    Parsed by pydantic's JSON parser straight from the bytes: invalid UTF-8, a lone surrogate escape, nesting
    past its limit and trailing bytes are malformed JSON, not a traceback."""
    shape = ChatRequest if chat else CompletionRequest
    try:
        body = shape.model_validate_json(raw)
    except ValidationError as e:
        raise refusal(e, shape) from None
    for name in UNSUPPORTED:
        if getattr(body, name) not in (None, False, 0):
            raise BadRequest(f"{name}: {UNSUPPORTED[name]} by this server", name)
    if chat:
        prompt = chat_prompt(body.messages, render_chat)
        if body.max_completion_tokens is not None and body.max_tokens is not None:
            raise BadRequest("give max_tokens or max_completion_tokens, not both", "max_completion_tokens")
        max_tokens = body.max_tokens if body.max_tokens is not None else body.max_completion_tokens
    else:
        prompt, max_tokens = completion_prompt(body.prompt), body.max_tokens
    stops = stop_strings(body.stop)
    params = SamplingParams(1.0 if body.temperature is None else body.temperature, body.top_k or 0,
                            1.0 if body.top_p is None else body.top_p)
    options = body.stream_options or StreamOptions()
    return Ask(chat, prompt, max_tokens, params, body.seed, stops, bool(body.stream), options.include_usage,
               body.model, body.tinyspec.draft_n if body.tinyspec else None)


def refusal(e: ValidationError, shape: type[BaseModel]) -> BadRequest:
    """pydantic's first complaint -> one line naming the field and what it must be."""
    err = e.errors(include_url=False)[0]
    kind, loc = err["type"], err["loc"]
    if kind == "json_invalid":
        why = err["msg"].removeprefix("Invalid JSON: ")
        return BadRequest(f"malformed JSON: {'nested too deeply' if 'recursion' in why else why}")
    if not loc:
        return BadRequest("the request body must be a JSON object")
    field = str(loc[0])
    where = field + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc[1:] if not TYPE_NAME.match(str(p)))
    if kind == "extra_forbidden" and len(loc) == 1:
        known = sorted(n for n in shape.model_fields if n not in UNSUPPORTED)
        return BadRequest(f"unknown field {field!r} (this endpoint takes {', '.join(known)})", field)
    if kind == "extra_forbidden":
        return BadRequest(f"{where}: unknown field (a message takes role, content, name)", field)
    got = repr(err.get("input"))
    return BadRequest(f"{field} must be {MUST.get(field, 'as OpenAI defines it')}, got {where}: "
                      f"{got if len(got) <= 60 else got[:57] + '...'}", field)


def completion_prompt(prompt) -> str | list[int]:
    """A completion's prompt: one text, or one list of token ids (a list of one text is that text)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise BadRequest("prompt is empty: give at least one character or token id", "prompt")
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return prompt  # ids are checked against the vocabulary by the engine's check_prompt
    if prompt is None:
        raise BadRequest("prompt is missing: give a text or a list of token ids", "prompt")
    raise BadRequest(f"prompt must be {MUST['prompt']}", "prompt")


def chat_prompt(messages: list[Message] | None, render_chat) -> str:
    """A chat's messages, rendered by the file's template."""
    if render_chat is None:
        raise BadRequest("this model file has no chat template (tokenizer.chat_template): use /v1/completions "
                         "with a prompt", "messages")
    if not messages:
        raise BadRequest(f"messages must be {MUST['messages']}", "messages")
    checked = []
    for i, m in enumerate(messages):
        if m.content is None:
            raise BadRequest(f"messages[{i}].content must be a text", f"messages[{i}]")
        content = m.content if isinstance(m.content, str) else "".join(p.text for p in m.content)
        checked.append({"role": m.role, "content": content} | ({"name": m.name} if m.name is not None else {}))
    return render_chat(checked)


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if len(stops) > MAX_STOPS or not all(0 < len(s) <= MAX_STOP_CHARS for s in stops):
        raise BadRequest(f"stop must be {MUST['stop']}", "stop")
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
