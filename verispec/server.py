"""OpenAI-compatible HTTP API over one Session (FastAPI + uvicorn, SSE streaming).

The server only translates (STYLE habit 9): a request becomes (prompt ids, RunSettings,
logprobs, pin) for `Session.generate`; the tokens it reports through `on_token` become text
(StreamDecoder, never half a UTF-8 character), SSE chunks and logprob entries. One model,
one request at a time in arrival order: every generation runs on a single worker thread;
when more than `queue_size` requests wait behind the running one, a request gets 429.

Errors use OpenAI's shape: {"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from .config import RunSettings
from .errors import UsageError
from .sampling import SamplingParams
from .tokenizer import StreamDecoder, Tokenizer
from .tokenizer import token_bytes as _token_bytes

MAX_TOP_LOGPROBS = 20
# Fields a client may send that change nothing here. Every other field we do not model is
# refused: an unknown field may change the semantics (fail loudly, STYLE habit 10).
IGNORED_FIELDS = {"user", "metadata", "store", "service_tier"}
_WHY = {
    "best_of": "only one candidate is generated (best_of must be 1)",
    "logit_bias": "logit_bias is not supported",
    "tools": "tool calls are not supported",
    "tool_choice": "tool calls are not supported",
    "functions": "function calls are not supported",
    "function_call": "function calls are not supported",
    "parallel_tool_calls": "tool calls are not supported",
    "response_format": "response_format (JSON mode, schemas) is not supported",
    "echo": "echo is not supported",
    "suffix": "suffix (insertion) is not supported",
    "presence_penalty": "presence_penalty must be 0 (penalties are not supported)",
    "frequency_penalty": "frequency_penalty must be 0 (penalties are not supported)",
    "repetition_penalty": "repetition penalties are not supported",
    "min_p": "min_p is not supported",
}
_HARMLESS_DEFAULTS = {"best_of": (1,), "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0),
                      "echo": (False,), "suffix": ("",), "parallel_tool_calls": (True, False)}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type_


def _error(status: int, message: str, param=None, code=None, type_="invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}}, status)


# ----------------------------------------------------------------------------- request shapes

class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="allow")


class StreamOptions(_Strict):
    include_usage: bool | None = False          # null: the default, as OpenAI takes it


class _Common(_Strict):
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)          # extension
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False                    # (null for these: their defaults)
    stream_options: StreamOptions | None = None
    n: int | None = 1
    pin: bool | None = False                       # extension


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    role: str
    content: str | list[TextPart]
    name: str | None = None


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)


# ----------------------------------------------------------------------------- a turn

@dataclass
class Turn:
    """One request, translated: what Session.generate is given, plus the stop strings."""
    prompt: list[int]
    settings: RunSettings
    logprobs: int | None
    pin: bool
    stop: list[str]
    text_offset: int = 0           # completions: the prompt's length in characters (OpenAI's text_offset base)
    cancelled: threading.Event = field(default_factory=threading.Event)


class _Text:
    """Token ids -> emitted text: StreamDecoder, end-of-sequence ids left out, and stop strings
    held back until they can no longer start one; the text ends before the first stop."""

    def __init__(self, tokenizer: Tokenizer, eos: set[int], stop: list[str]):
        self.dec = StreamDecoder(tokenizer)
        self.eos, self.stop = eos, stop
        self.text = ""          # all decoded text so far
        self.sent = 0           # chars of self.text already emitted
        self.stopped = False

    def push(self, tok: int) -> str:
        if tok in self.eos:
            return ""
        self.text += self.dec.push(tok)
        return self._emit(final=False)

    def begins_at(self, tok: int) -> int:
        """Where the text of `tok`, pushed next, begins in self.text."""
        return len(self.text) + self.dec.held_chars(tok)

    def flush(self) -> str:
        if not self.stopped:
            self.text += self.dec.flush()
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        if self.stopped:
            return ""
        end = len(self.text)
        hits = [i for i in (self.text.find(s, max(0, self.sent - len(s))) for s in self.stop) if i >= 0]
        if hits:
            end, self.stopped = min(hits), True
        elif not final:
            for s in self.stop:   # hold back a tail that may still grow into a stop string
                for k in range(min(len(s) - 1, end - self.sent), 0, -1):
                    if self.text.endswith(s[:k]):
                        end = min(end, len(self.text) - k)
                        break
        out = self.text[self.sent:end]
        self.sent = max(self.sent, end)
        if self.stopped:
            self.text = self.text[:end]
        return out


class Worker:
    """One generation at a time, in arrival order, with a bounded wait queue."""

    def __init__(self, session, queue_size: int):
        self.session = session
        self.queue_size = queue_size
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verispec-generate")
        self.pending = 0                 # accepted and not finished, the running one included
        self.rejected = 0
        self._lock = threading.Lock()

    def admit(self) -> bool:
        with self._lock:
            if self.pending > self.queue_size:     # one running + queue_size waiting
                self.rejected += 1
                return False
            self.pending += 1
            return True

    def done(self) -> None:
        with self._lock:
            self.pending -= 1

    def run(self, turn: Turn, on_token):
        """In the worker thread: the turn's TurnResult, or None when cancelled before it began."""
        try:
            if turn.cancelled.is_set():
                return None
            return self.session.generate(turn.prompt, turn.settings, on_token=on_token, pin=turn.pin,
                                         logprobs=turn.logprobs)
        finally:
            self.done()


# ----------------------------------------------------------------------------- the app

def create_app(session, model_name: str, tokenizer: Tokenizer | None, queue_size: int = 16,
               save_usage: bool = True) -> FastAPI:
    worker = Worker(session, queue_size)
    eos = set(getattr(session.engine, "eos_ids", set())) if hasattr(session, "engine") else set()
    context = getattr(session, "context", None)
    vocab = session.engine.args.vocab_size if hasattr(session, "engine") else None
    created = int(time.time())
    served = {"cancelled_by_client": 0}

    @asynccontextmanager
    async def lifespan(app):
        print(f"[verispec] serving {model_name}", file=sys.stderr, flush=True)
        yield
        # uvicorn has stopped accepting and let the open requests finish; wait for the worker,
        # then write the MTP vocabulary counts.
        await asyncio.get_running_loop().run_in_executor(None, worker.pool.shutdown, True)
        if save_usage:
            session.save_usage()
        print("[verispec] server stopped", file=sys.stderr, flush=True)

    app = FastAPI(title="verispec", lifespan=lifespan)
    app.state.worker = worker

    @app.exception_handler(APIError)
    async def _api_error(request, e: APIError):
        return _error(e.status, e.message, e.param, e.code, e.type)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, e: RequestValidationError):
        err = (e.errors() or [{}])[0]
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        if err.get("type") == "json_invalid":
            return _error(400, f"malformed JSON body: {err.get('ctx', {}).get('error', err.get('msg'))}")
        param = ".".join(loc) or None
        msg = err.get("msg", "invalid request")
        return _error(400, f"{param}: {msg}" if param else msg, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, e: StarletteHTTPException):
        return _error(e.status_code, str(e.detail), type_="invalid_request_error" if e.status_code < 500
                      else "server_error")

    # ----- translation helpers -----
    def check_common(req: _Common) -> None:
        for key, value in (req.model_extra or {}).items():
            if key in IGNORED_FIELDS or value is None or value in _HARMLESS_DEFAULTS.get(key, ()):
                continue
            raise APIError(400, f"unsupported parameter {key!r}: {_WHY.get(key, 'not a parameter this server knows')}",
                           key, "unsupported_parameter")
        if req.model is not None and req.model != model_name:
            raise APIError(404, f"model {req.model!r} is not served here (this server serves {model_name!r})",
                           "model", "model_not_found")
        if req.n not in (None, 1):
            raise APIError(400, f"n must be 1 (one choice per request), got {req.n}", "n")
        if req.stream_options is not None and not req.stream:
            raise APIError(400, "stream_options needs stream: true", "stream_options")
        extra = req.stream_options.model_extra if req.stream_options is not None else None
        unknown = [k for k, v in (extra or {}).items() if v is not None and v is not False]
        if unknown:
            raise APIError(400, f"unsupported parameter 'stream_options.{unknown[0]}': stream_options takes "
                           "include_usage", f"stream_options.{unknown[0]}", "unsupported_parameter")
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if any(s == "" for s in stops) or len(stops) > 16:
            raise APIError(400, "stop: at most 16 non-empty strings", "stop")

    def settings_for(req: _Common, prompt: list[int], max_tokens: int | None) -> RunSettings:
        if tokenizer is None and (req.stop or isinstance(getattr(req, "prompt", None), str)):
            raise APIError(400, "this checkpoint has no tokenizer.json: give the prompt as token ids", "prompt")
        if not prompt:
            raise APIError(400, "the prompt is empty", "prompt")
        if vocab is not None and any(not 0 <= t < vocab for t in prompt):
            raise APIError(400, f"token ids must be in 0..{vocab - 1}", "prompt")
        room = context - len(prompt) if context else None
        if room is not None and room < 1:
            raise APIError(400, f"the prompt ({len(prompt)} tokens) does not fit the context ({context} tokens)",
                           "messages" if isinstance(req, ChatRequest) else "prompt", "context_length_exceeded")
        if max_tokens is None:
            max_tokens = room if room is not None else 16
        elif room is not None and max_tokens > room:
            raise APIError(400, f"the prompt ({len(prompt)} tokens) plus max_tokens {max_tokens} exceeds the "
                           f"context ({context} tokens)", "max_tokens", "context_length_exceeded")
        try:
            sampling = SamplingParams(1.0 if req.temperature is None else req.temperature,
                                      1.0 if req.top_p is None else req.top_p, req.top_k or 0, req.seed or 0)
        except ValueError as e:
            raise APIError(400, str(e)) from None
        return RunSettings(max_tokens=max_tokens, sampling=sampling, drafts=session.drafts, context=context)

    def token_bytes(t: int) -> list[int] | None:
        return _token_bytes(tokenizer, t) if tokenizer else None

    def token_text(t: int) -> str:
        """The token's text; a token that is not whole UTF-8 by itself is written as OpenAI
        does, "bytes:\\xe2\\x80", so distinct tokens keep distinct strings."""
        if tokenizer is None:
            return str(t)
        s = tokenizer.decode([t])
        b = token_bytes(t) if "\ufffd" in s else None
        return "bytes:" + "".join(f"\\x{x:02x}" for x in b) if b is not None else s

    def chat_logprobs(entries) -> dict:
        return {"content": [{"token": token_text(e.token), "logprob": e.logprob, "bytes": token_bytes(e.token),
                             "top_logprobs": [{"token": token_text(t), "logprob": lp, "bytes": token_bytes(t)}
                                              for t, lp in e.top]} for e in entries]}

    def completion_logprobs(entries, starts: list[int], base: int) -> dict:
        """starts: where each token's text begins in the completion's text (a token that is not
        whole UTF-8 begins where the character it starts will stand)."""
        return {"tokens": [token_text(e.token) for e in entries], "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [{token_text(t): lp for t, lp in e.top} for e in entries],
                "text_offset": [base + s for s in starts]}

    # ----- running a turn -----
    async def execute(request: Request, turn: Turn, chat: bool):
        if not worker.admit():
            raise APIError(429, f"the server is busy: {worker.queue_size} requests already wait", None,
                           "queue_full", "rate_limit_error")
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        text = _Text(tokenizer, eos, turn.stop) if tokenizer else None
        held: list = []           # (logprob entry, start in the text) of tokens whose text is not out yet
        plain = 0                 # no tokenizer: the text's length so far (ids as "id ")

        def put(ev):
            try:
                loop.call_soon_threadsafe(events.put_nowait, ev)
            except RuntimeError:     # the loop is gone (shutdown): nobody listens
                turn.cancelled.set()

        def on_token(tok: int, entry):
            nonlocal plain
            if turn.cancelled.is_set():
                return False
            start = text.begins_at(tok) if text else plain
            delta = text.push(tok) if text else f"{tok} "
            plain += len(delta)
            if entry is not None and tok not in eos:
                held.append((entry, start))
            # a token's entry goes out with the first of its text (a text held back because it may
            # start a stop string holds its tokens too); past a stop, the text's end
            sent = text.sent if text else plain
            ready = [pair for pair in held if pair[1] < sent]
            if delta or ready or (text and text.stopped):
                put(("delta", delta, ready))
                del held[:len(ready)]
            if text is not None and text.stopped:
                return False
            return None

        fut = loop.run_in_executor(worker.pool, worker.run, turn, on_token)
        fut.add_done_callback(lambda f: events.put_nowait(("end", f)))
        return events, fut, text, held

    def in_text(pairs: list, text) -> list:
        """The (entry, start) pairs whose token put something into the text returned: after a
        stop string the text ends before it, and the tokens past that end are left out."""
        if text is None or not text.stopped:
            return list(pairs)
        return [(e, s) for e, s in pairs if s < len(text.text)]

    def client_left() -> JSONResponse:
        served["cancelled_by_client"] += 1
        return _error(499, "the client closed the request", code="client_closed")

    def finish_of(res, text) -> str:
        if text is not None and text.stopped:
            return "stop"
        return res.finish_reason

    def usage(turn: Turn, res) -> dict:
        n = len(res.ids)
        return {"prompt_tokens": len(turn.prompt), "completion_tokens": n, "total_tokens": len(turn.prompt) + n}

    def extension(res) -> dict:
        # the generated ids (a client can continue by ids, byte-exact) and the turn's stats
        return {"completion_ids": list(res.ids), "stats": json.loads(json.dumps(res.stats, default=str))}

    async def respond(request: Request, turn: Turn, chat: bool, stream: bool, include_usage: bool):
        events, fut, text, held = await execute(request, turn, chat)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        base = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": model_name}

        checked = time.monotonic()

        async def next_event():
            # notice a client that went away (its turn is then skipped or stopped at the next
            # token), at most every 0.5 s, also while tokens keep coming
            nonlocal checked
            while True:
                if time.monotonic() - checked >= 0.5:
                    checked = time.monotonic()
                    if await request.is_disconnected():
                        turn.cancelled.set()
                try:
                    return await asyncio.wait_for(events.get(), timeout=0.5)
                except asyncio.TimeoutError:
                    pass

        def cancelled(res) -> bool:
            return res is None or (res.finish_reason == "cancelled" and not (text and text.stopped))

        first = await next_event()
        if first[0] == "end":
            exc = first[1].exception()
            if isinstance(exc, UsageError):
                raise APIError(400, str(exc))
            if exc is not None:
                raise exc
            if cancelled(first[1].result()):     # skipped in the queue: its client left
                return client_left()

        if not stream:
            parts, pairs, ev = [], [], first
            while ev[0] != "end":
                parts.append(ev[1])
                pairs += ev[2]
                ev = await next_event()
            res = ev[1].result()
            if cancelled(res):
                return client_left()
            out = "".join(parts) + (text.flush() if text else "")
            pairs = in_text(pairs + held, text) if res.logprobs is not None else None
            entries = [e for e, _ in pairs] if pairs is not None else None
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": out},
                          "logprobs": chat_logprobs(entries) if entries is not None else None,
                          "finish_reason": finish_of(res, text)}
                obj = "chat.completion"
            else:
                lp = completion_logprobs(entries, [s for _, s in pairs], turn.text_offset) if pairs is not None \
                    else None
                choice = {"index": 0, "text": out, "logprobs": lp,
                          "finish_reason": finish_of(res, text)}
                obj = "text_completion"
            return JSONResponse(dict(base, object=obj, choices=[choice], usage=usage(turn, res),
                                     verispec=extension(res)))

        def chunk(delta_text: str | None, pairs, finish=None, role=False) -> str:
            entries = [e for e, _ in pairs] if pairs else None
            if chat:
                delta = {"role": "assistant", "content": ""} if role else (
                    {"content": delta_text} if delta_text is not None else {})
                lp = chat_logprobs(entries) if entries and turn.logprobs is not None else None
                c = {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}
            else:
                lp = completion_logprobs(entries, [s for _, s in pairs], turn.text_offset) \
                    if entries and turn.logprobs is not None else None
                c = {"index": 0, "text": delta_text or "", "logprobs": lp, "finish_reason": finish}
            return "data: " + json.dumps(dict(base, choices=[c])) + "\n\n"

        async def sse():
            ev, ended = first, False
            try:
                if chat:
                    yield chunk(None, None, role=True)
                while ev[0] != "end":
                    yield chunk(ev[1], ev[2])
                    ev = await events.get()
                ended = True
                res = ev[1].result()
                tail = text.flush() if text else ""
                rest = in_text(held, text)
                if tail or rest:
                    yield chunk(tail, rest)
                last = json.loads(chunk(None, None, finish=finish_of(res, text))[6:])
                last["verispec"] = extension(res)
                if include_usage:
                    last["usage"] = usage(turn, res)
                yield "data: " + json.dumps(last) + "\n\n"
                yield "data: [DONE]\n\n"
            finally:
                if not ended:        # the client went away (or the server cancelled the stream)
                    turn.cancelled.set()
                    served["cancelled_by_client"] += 1

        return StreamingResponse(sse(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    # ----- endpoints -----
    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest, request: Request):
        check_common(req)
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        if tokenizer is None or not tokenizer.has_chat_template:
            raise APIError(400, "this checkpoint has no chat template: use /v1/completions", "messages")
        messages = [{"role": m.role, "content": m.content if isinstance(m.content, str)
                     else "".join(p.text for p in m.content)} for m in req.messages]
        try:
            # off the event loop: a huge prompt must not stall the other requests and /health
            prompt = await run_in_threadpool(lambda: tokenizer.encode(tokenizer.apply_chat_template(messages)))
        except Exception as e:   # the template's raise_exception (unknown role, order) and friends
            raise APIError(400, f"the chat template refused the messages: {e}", "messages") from None
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        turn = Turn(prompt, settings_for(req, prompt, max_tokens),
                    (req.top_logprobs or 0) if req.logprobs else None, bool(req.pin), _stops(req.stop))
        return await respond(request, turn, True, bool(req.stream),
                             bool(req.stream_options and req.stream_options.include_usage))

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        check_common(req)
        p = req.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise APIError(400, "one prompt per request (a list of prompts needs n choices)", "prompt")
            p = p[0]
        if isinstance(p, str):
            if tokenizer is None:
                raise APIError(400, "this checkpoint has no tokenizer.json: give the prompt as token ids", "prompt")
            prompt = await run_in_threadpool(tokenizer.encode, p)
        else:
            prompt = list(p)
        settings = settings_for(req, prompt, req.max_tokens)
        # text_offset counts from the prompt's start, as OpenAI's does (ids: their decoded text)
        base = len(p) if isinstance(p, str) else (
            len(await run_in_threadpool(tokenizer.decode, prompt)) if tokenizer is not None and
            req.logprobs is not None else 0)
        turn = Turn(prompt, settings, req.logprobs, bool(req.pin), _stops(req.stop), text_offset=base)
        return await respond(request, turn, False, bool(req.stream),
                             bool(req.stream_options and req.stream_options.include_usage))

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "verispec"}]}

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_name, "pending": worker.pending}

    @app.get("/metrics")
    async def metrics():
        m = dict(session.metrics)
        lines = _prometheus(m) + _prometheus({"queue_rejections": worker.rejected,
                                              "client_disconnects": served["cancelled_by_client"]})
        lines += ["# HELP verispec_pending_requests Requests accepted and not finished (the running one included).",
                  "# TYPE verispec_pending_requests gauge", f"verispec_pending_requests {worker.pending}"]
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    return app




def _stops(stop) -> list[str]:
    return [stop] if isinstance(stop, str) else list(stop or [])


_HELP = {
    "requests": "Generation requests served.",
    "prompt_tokens": "Prompt tokens of the served requests.",
    "completion_tokens": "Tokens generated.",
    "forwards": "Decode forwards (plain steps and verifies).",
    "drafts_proposed": "Drafts carried by verifies, by draft source.",
    "drafts_accepted": "Drafts accepted, by draft source.",
    "verifies": "Verify forwards, by draft source.",
    "prefix_reuses": "Requests that extended the cached transcript and fed only their new tokens.",
    "pin_restores": "Requests that restored a pinned snapshot.",
    "reused_tokens": "Prompt tokens not fed again thanks to prefix reuse or a pin.",
    "cancelled": "Generations stopped early (client gone or a stop string).",
    "queue_rejections": "Requests answered 429 because the queue was full.",
    "client_disconnects": "Requests whose client went away before the end.",
}


def _prometheus(metrics: dict[str, Any]) -> list[str]:
    lines = []
    for key, value in metrics.items():
        name = f"verispec_{key}_total"
        if isinstance(value, dict):
            samples = [(f'{name}{{source="{k}"}}', v) for k, v in sorted(value.items())]
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            samples = [(name, value)]
        else:
            continue
        lines += [f"# HELP {name} {_HELP.get(key, key.replace('_', ' ') + '.')}", f"# TYPE {name} counter"]
        lines += [f"{n} {v:g}" if isinstance(v, float) and math.isfinite(v) else f"{n} {v}" for n, v in samples]
    return lines
