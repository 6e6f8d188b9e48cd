"""`verispec serve` over real HTTP: a uvicorn server on 127.0.0.1 and the official openai client.

The drafted server (lookup + MTP head, gate off so both sources verify) and the plain
server (--lookup off --mtp off) must serve the same frames: text, streamed deltas,
logprobs, finish reasons, prefix reuses and pin restores.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from model_fixtures import REPEAT_PROMPT, fixture_dir
from utf8_ref import char_of_byte
from verispec.cli import build_parser
from verispec.drafts.vocab import VocabList
from verispec.serve_cli import build_server

FIXTURE = dict(family="qwen3_next", seed=0, mtp=True, byte_tokenizer=True, aligned_head=True)
DRAFTED = ["--lookup", "on", "--mtp", "on", "--mtp-drafts", "2", "--gate", "off", "--mtp-vocab", "0"]
PLAIN = ["--lookup", "off", "--mtp", "off"]
EOS_PROMPT = "how"   # this fixture's greedy reply to it ends with <|im_end|> at its 21st token


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    def __init__(self, port: int):
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self.client = openai.OpenAI(base_url=self.base + "/v1", api_key="x", max_retries=0, timeout=120)
        self.model = self.client.models.list().data[0].id

    def metrics(self) -> dict:
        out = {}
        for line in httpx.get(self.base + "/metrics").text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def idle(self, timeout: float = 30.0) -> None:
        end = time.monotonic() + timeout
        while httpx.get(self.base + "/health").json()["pending"]:
            assert time.monotonic() < end, "the server still runs a generation"
            time.sleep(0.05)


@contextlib.contextmanager
def serving(tmp_path: Path, *flags: str):
    """A real uvicorn server in a thread of this process."""
    port = _free_port()
    a = build_parser().parse_args(["serve", "--model", str(fixture_dir(**FIXTURE)), "--port", str(port),
                                   "--context", "1024", "--vocab-usage", str(tmp_path / f"usage-{port}.bin"),
                                   *flags])
    server = build_server(a)
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    end = time.monotonic() + 60
    while not server.started:
        assert th.is_alive() and time.monotonic() < end, "the server did not start"
        time.sleep(0.02)
    try:
        yield Served(port)
    finally:
        server.should_exit = True
        th.join(30)


# ----------------------------------------------------------------------------- the 9-turn session

def _lp_chat(c):
    return [(t.token, t.logprob, [(x.token, x.logprob) for x in t.top_logprobs]) for t in c.logprobs.content] \
        if c.logprobs else None


def _lp_comp(c):
    return [c.logprobs.tokens, c.logprobs.token_logprobs, c.logprobs.top_logprobs] if c.logprobs else None


def _frames_chat(s: Served, messages, **kw):
    r = s.client.chat.completions.create(model=s.model, messages=messages, **kw)
    c = r.choices[0]
    return {"text": c.message.content, "finish": c.finish_reason, "logprobs": _lp_chat(c),
            "ids": r.verispec["completion_ids"], "stats": r.verispec["stats"]}


def _frames_comp(s: Served, prompt, **kw):
    r = s.client.completions.create(model=s.model, prompt=prompt, **kw)
    c = r.choices[0]
    return {"text": c.text, "finish": c.finish_reason, "logprobs": _lp_comp(c),
            "ids": r.verispec["completion_ids"], "stats": r.verispec["stats"]}


def _frames_stream(s: Served, messages=None, prompt=None, **kw):
    """Every chunk as (text delta, logprobs, finish reason); chat with messages, completions with prompt."""
    if messages is not None:
        it = s.client.chat.completions.create(model=s.model, messages=messages, stream=True, **kw)
    else:
        it = s.client.completions.create(model=s.model, prompt=prompt, stream=True, **kw)
    chunks, ext = [], None
    for ch in it:
        c = ch.choices[0]
        if messages is not None:
            chunks.append((c.delta.content, _lp_chat(c), c.finish_reason))
        else:
            chunks.append((c.text, _lp_comp(c), c.finish_reason))
        if c.finish_reason:
            ext = ch.verispec
    text = "".join(d for d, _, _ in chunks if d)
    return {"text": text, "finish": chunks[-1][2], "chunks": chunks, "ids": ext["completion_ids"],
            "stats": ext["stats"]}


# every bigram (65, x): after a 65 lookup always finds the pick's bigram earlier and proposes
LOOKUP_BAIT = [t for x in range(256) for t in (65, x)] + [65]


def _session(s: Served) -> list[dict]:
    """Nine turns; each later turn is built from the replies this server gave."""
    out = []
    out.append(_frames_stream(s, prompt=REPEAT_PROMPT, max_tokens=12, temperature=0))         # 1 repeating, streamed
    p2 = REPEAT_PROMPT + out[0]["ids"] + [7, 11, 13]
    out.append(_frames_comp(s, p2, max_tokens=12, temperature=0, logprobs=3))                # 2 prefix reuse, logprobs
    m3 = [{"role": "system", "content": "Count."}, {"role": "user", "content": "one two three one two three"}]
    out.append(_frames_chat(s, m3, max_tokens=10, temperature=0, extra_body={"pin": True}))   # 3 pinned
    out.append(_frames_comp(s, "something else entirely", max_tokens=10, temperature=0))     # 4 another prompt
    m5 = m3 + [{"role": "assistant", "content": out[2]["text"]}, {"role": "user", "content": "four"}]
    out.append(_frames_chat(s, m5, max_tokens=10, temperature=0, logprobs=True, top_logprobs=2))  # 5 restores the pin
    p6 = p2 + out[1]["ids"] + [1, 2]
    out.append(_frames_comp(s, p6, max_tokens=12, temperature=0.9, top_p=0.95, seed=42,      # 6 sampled; restores p2
                            logprobs=2))
    m7 = [{"role": "user", "content": EOS_PROMPT}]
    out.append(_frames_chat(s, m7, max_tokens=32, temperature=0))                             # 7 eos in a verify
    out.append(_frames_comp(s, LOOKUP_BAIT, max_tokens=9, temperature=0))                    # 8 lookup, ends mid-verify
    m9 = m7 + [{"role": "assistant", "content": out[6]["text"]}, {"role": "user", "content": "abc abc abc"}]
    out.append(_frames_stream(s, m9, max_tokens=14, temperature=0.9, top_p=0.95, seed=7,      # 9 streamed, sampled
                              logprobs=True, top_logprobs=2))
    return out


def _delta(after: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def test_session_with_and_without_drafts_frame_by_frame(tmp_path):
    with serving(tmp_path, *DRAFTED) as d, serving(tmp_path, *PLAIN) as p:
        runs, counts = [], []
        for s in (d, p):
            before = s.metrics()
            runs.append(_session(s))
            counts.append(_delta(s.metrics(), before))
    drafted, plain = runs
    for i, (a, b) in enumerate(zip(drafted, plain), 1):
        for key in ("text", "ids", "finish", "logprobs", "chunks"):
            assert a.get(key) == b.get(key), f"turn {i}: {key} differs with drafts"
        for key in ("reused_tokens", "pin_restored"):
            assert a["stats"][key] == b["stats"][key], f"turn {i}: {key} differs with drafts"
    for t in drafted:
        if "chunks" in t:     # the streamed deltas are the text, split at clean UTF-8 boundaries
            deltas = [d for d, _, _ in t["chunks"] if d]
            assert "".join(deltas) == t["text"] and not any(d.endswith("\ufffd") for d in deltas[:-1])
    assert drafted[1]["stats"]["reused_tokens"] == len(REPEAT_PROMPT) + 11 and not drafted[1]["stats"]["pin_restored"]
    assert drafted[4]["stats"]["pin_restored"] and drafted[5]["stats"]["pin_restored"]
    assert len(drafted[1]["logprobs"][0]) == 12 and all(len(t) == 3 for t in drafted[1]["logprobs"][2])
    assert len(drafted[4]["logprobs"]) == 10 and all(len(t[2]) == 2 for t in drafted[4]["logprobs"])
    # the eos turn: <|im_end|> is picked inside a verify (its drafts still pending: ended mid-verify)
    assert drafted[6]["finish"] == "stop" and drafted[6]["stats"]["generated"] == 21
    assert drafted[6]["stats"]["ended_mid_verify"] and drafted[6]["stats"]["verifies"] > 0
    assert any(t["stats"]["ended_mid_verify"] and t["finish"] == "length" for t in drafted)
    # /metrics: the same reuse and restore numbers; verifies from both sources in the drafted one
    dm, pm = counts
    for key in ("verispec_prefix_reuses_total", "verispec_pin_restores_total", "verispec_requests_total",
                "verispec_completion_tokens_total", "verispec_prompt_tokens_total"):
        assert dm[key] == pm[key], key
    assert dm["verispec_prefix_reuses_total"] >= 1 and dm["verispec_pin_restores_total"] >= 1
    assert dm['verispec_verifies_total{source="mtp"}'] >= 1
    assert dm['verispec_verifies_total{source="lookup"}'] >= 1
    assert dm['verispec_drafts_proposed_total{source="mtp"}'] >= 1
    assert dm['verispec_drafts_proposed_total{source="lookup"}'] >= 1
    assert not any("verifies_total" in k for k in pm)
    assert dm["verispec_forwards_total"] < pm["verispec_forwards_total"] + 1e9   # present in both


# ----------------------------------------------------------------------------- stop strings

def test_stop_string_then_continuation(tmp_path):
    """A stop string ends the turn through on_token (as a client that goes away does); the
    next request extends the transcript that turn left, by ids, and reuses its state."""
    with serving(tmp_path, *DRAFTED) as d, serving(tmp_path, *PLAIN) as p:
        full = _frames_comp(d, REPEAT_PROMPT, max_tokens=16, temperature=0)["text"]
        cut = next(i for i in range(3, len(full) - 2) if "\ufffd" not in full[i:i + 2])
        stop = full[cut:cut + 2]
        want = full[:full.find(stop)]
        results = []
        for s in (d, p):
            a = _frames_comp(s, REPEAT_PROMPT, max_tokens=16, temperature=0, stop=[stop, "never-there"])
            b = _frames_stream(s, prompt=REPEAT_PROMPT, max_tokens=16, temperature=0, stop=stop)
            assert a["text"] == want and a["finish"] == "stop"
            assert b["text"] == want and b["finish"] == "stop" and b["ids"] == a["ids"]
            assert len(a["ids"]) < 16
            nxt = _frames_comp(s, REPEAT_PROMPT + b["ids"] + [5, 9], max_tokens=10, temperature=0, logprobs=2)
            assert nxt["stats"]["reused_tokens"] == len(REPEAT_PROMPT) + len(b["ids"]) - 1
            assert not nxt["stats"]["pin_restored"]
            c = _frames_stream(s, [{"role": "user", "content": "abc"}], max_tokens=16, temperature=0, stop=stop)
            results.append((a["ids"], b["chunks"], c["chunks"], nxt))
        assert results[0][:3] == results[1][:3]
        for key in ("text", "ids", "finish", "logprobs"):
            assert results[0][3][key] == results[1][3][key], key


# ----------------------------------------------------------------------------- bad input

def _bad_requests(model: str):
    msgs = [{"role": "user", "content": "hi"}]
    chat = lambda **kw: ("/v1/chat/completions", dict({"model": model, "messages": msgs}, **kw))  # noqa: E731
    comp = lambda **kw: ("/v1/completions", dict({"model": model, "prompt": "hi"}, **kw))  # noqa: E731
    return [
        ("/v1/chat/completions", b'{"model": "x", "messages": [{"role": "us'),      # malformed JSON
        ("/v1/chat/completions", b"[1, 2, 3]"),                                    # not an object
        ("/v1/chat/completions", b"\xff\xfe not json"),
        chat(max_tokens="ten"), chat(temperature="hot"), chat(messages="hi"), chat(stream="yes"),
        chat(stop=5), chat(messages=[{"role": "user", "content": 7}]), chat(seed=1.5),
        chat(max_tokens=-1), chat(max_tokens=0), chat(max_tokens=10**9), comp(max_tokens=2**70),
        chat(temperature=-0.5), chat(top_p=0), chat(top_p=1.5), chat(top_k=-1),
        chat(n=2), comp(n=3), comp(best_of=3), chat(logit_bias={"5": 10}),
        chat(tools=[{"type": "function", "function": {"name": "f"}}]),
        chat(response_format={"type": "json_object"}), chat(presence_penalty=0.5), chat(frobnicate=True),
        chat(top_logprobs=3), chat(logprobs=True, top_logprobs=99), comp(logprobs=99), comp(echo=True),
        chat(messages=[{"role": "tool", "content": "x"}]), chat(messages=[]),
        chat(messages=[{"role": "user", "content": "x", "tool_calls": []}]),
        comp(prompt=""), comp(prompt=[999]), comp(prompt=[-1]), comp(prompt=["a", "b"]),
        comp(prompt="x" * 1100),                                                   # beyond the context
        comp(stream=True, stream_options={"include_usage": True, "frobnicate": 1}),
        chat(model="some-other-model"),
    ]


def test_bad_input_gets_4xx_and_the_server_keeps_serving(tmp_path):
    with serving(tmp_path, *DRAFTED) as s:
        for path, body in _bad_requests(s.model):
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            r = httpx.post(s.base + path, content=content, headers={"content-type": "application/json"}, timeout=60)
            assert 400 <= r.status_code < 500, (body, r.status_code, r.text)
            err = r.json()["error"]
            assert isinstance(err["message"], str) and err["message"], body
            assert err["type"] == "invalid_request_error" and "param" in err and "code" in err, body
            ok = s.client.completions.create(model=s.model, prompt="hi", max_tokens=1, temperature=0)
            assert ok.choices[0].finish_reason in ("length", "stop"), body
        with pytest.raises(openai.BadRequestError):
            s.client.chat.completions.create(model=s.model, messages=[{"role": "user", "content": "x"}], n=2)
        assert httpx.get(s.base + "/nowhere").json()["error"]["message"]
        # harmless fields are ignored
        r = s.client.chat.completions.create(model=s.model, messages=[{"role": "user", "content": "x"}],
                                             max_tokens=2, user="me", temperature=0)
        assert r.choices[0].finish_reason == "length"
        # null is the default, as OpenAI takes it, for the fields that have one
        for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": None,
                                                     "n": None, "logprobs": None, "pin": None}),
                           ("/v1/completions", {"prompt": "x", "stream": True,
                                                "stream_options": {"include_usage": None, "include_obfuscation": False}})):
            r = httpx.post(s.base + path, json=dict(body, model=s.model, max_tokens=2, temperature=0), timeout=60)
            assert r.status_code == 200, (body, r.text)


# ----------------------------------------------------------------------------- disconnect, queue

def test_disconnect_mid_stream_then_continuation_equals_plain(tmp_path):
    """Both servers: a stream the client drops after 4 chunks (where the generation stops
    depends on timing), then continuations that restore the prompt's pin and reuse the
    state; the drafted server's frames equal the plain server's."""
    first = None
    with serving(tmp_path, *DRAFTED, "--queue", "0") as d, serving(tmp_path, *PLAIN, "--queue", "0") as p:
        results = []
        for s in (d, p):
            before = s.metrics()
            stream = s.client.completions.create(model=s.model, prompt=REPEAT_PROMPT, max_tokens=600,
                                                 temperature=0, stream=True)
            got = []
            for ch in stream:
                got.append(ch.choices[0].text)
                if len(got) >= 4:
                    break
            # one generation runs and --queue 0 lets none wait: 429 in OpenAI's shape
            r = httpx.post(s.base + "/v1/completions", json={"model": s.model, "prompt": "hi", "max_tokens": 1})
            assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error", r.text
            stream.close()
            s.idle()
            m = _delta(s.metrics(), before)
            assert m["verispec_cancelled_total"] == 1 and m["verispec_client_disconnects_total"] == 1
            assert m["verispec_completion_tokens_total"] < 600
            assert m["verispec_queue_rejections_total"] == 1
            if first is None:
                first = _frames_comp(p, REPEAT_PROMPT, max_tokens=1, temperature=0)["ids"][0]
            # diverges from the reply at once: the prompt's pin is restored
            x = _frames_comp(s, REPEAT_PROMPT + [(first + 1) % 256, 5, 9], max_tokens=12, temperature=0, logprobs=2)
            assert x["stats"]["pin_restored"]
            # extends the transcript just left: prefix reuse
            y = _frames_stream(s, prompt=REPEAT_PROMPT + [(first + 1) % 256, 5, 9] + x["ids"] + [3], max_tokens=12,
                               temperature=0.9, top_p=0.95, seed=3, logprobs=1)
            assert y["stats"]["reused_tokens"] > len(REPEAT_PROMPT) + 3 and not y["stats"]["pin_restored"]
            results.append((x["text"], x["ids"], x["logprobs"], y["chunks"], y["ids"]))
        assert results[0] == results[1]


def test_a_client_leaving_a_non_streamed_request_stops_it(tmp_path):
    """The client of a non-streamed request goes away mid-generation: the server notices while
    tokens keep coming, stops the turn at the next token and counts the disconnect."""
    with serving(tmp_path, *PLAIN) as s:
        before = s.metrics()
        try:
            httpx.post(s.base + "/v1/completions", json={"model": s.model, "prompt": REPEAT_PROMPT,
                                                         "max_tokens": 1000, "temperature": 0},
                       timeout=httpx.Timeout(60, read=0.5))
            pytest.skip("1000 tokens came back within the client's 0.5 s here (a GPU?): nothing to leave")
        except httpx.ReadTimeout:
            pass
        s.idle()
        m = _delta(s.metrics(), before)
        assert m["verispec_cancelled_total"] == 1 and m["verispec_client_disconnects_total"] == 1
        assert m["verispec_completion_tokens_total"] < 1000
        ok = s.client.completions.create(model=s.model, prompt="hi", max_tokens=2, temperature=0)
        assert ok.choices[0].finish_reason == "length"


def test_a_queued_stream_whose_client_left_is_skipped_and_counted(tmp_path):
    with serving(tmp_path, *PLAIN) as s:
        before = s.metrics()
        running = s.client.completions.create(model=s.model, prompt=REPEAT_PROMPT, max_tokens=1000,
                                              temperature=0, stream=True)
        next(iter(running))
        try:                                          # waits behind the running one, then gives up
            httpx.post(s.base + "/v1/completions", json={"model": s.model, "prompt": "hi", "max_tokens": 5,
                                                         "stream": True}, timeout=httpx.Timeout(60, read=0.5))
            pytest.skip("1000 tokens were done within 0.5 s here (a GPU?): the second request never waited")
        except httpx.ReadTimeout:
            pass
        time.sleep(1.2)                               # the server notices within a second
        running.close()
        s.idle()
        m = _delta(s.metrics(), before)
        assert m["verispec_client_disconnects_total"] == 2
        assert m["verispec_cancelled_total"] == 1 and m["verispec_requests_total"] == 1   # the queued one never ran
        ok = s.client.completions.create(model=s.model, prompt="hi", max_tokens=2, temperature=0)
        assert ok.choices[0].finish_reason == "length"


# ----------------------------------------------------------------------------- logprobs' text offsets

def _token_bytes(label: str) -> bytes:
    return bytes.fromhex(label[6:].replace("\\x", "")) if label.startswith("bytes:") else label.encode()


def test_completion_text_offsets_index_the_prompt_and_text(tmp_path):
    """text_offset: each token's start in prompt + text (OpenAI's base), where a token that is not whole
    UTF-8 begins at the character its first byte belongs to; streamed chunks carry the same offsets.
    The sampled reply of this byte-level fixture has lone bytes, broken and completed sequences."""
    prompt = "abc d\u00e9f "
    with serving(tmp_path, *PLAIN) as s:
        body = {"model": s.model, "prompt": prompt, "max_tokens": 60, "temperature": 1.0, "seed": 3, "logprobs": 1}
        c = httpx.post(s.base + "/v1/completions", json=body, timeout=60).json()["choices"][0]
        lp = c["logprobs"]
        raw = [_token_bytes(t) for t in lp["tokens"]]
        b = b"".join(raw)
        assert b.decode("utf-8", "replace") == c["text"]
        assert sum(t.startswith("bytes:") for t in lp["tokens"]) >= 5 and len(c["text"]) < len(b)
        where = char_of_byte(b)
        firsts = [sum(len(x) for x in raw[:i]) for i in range(len(raw))]
        assert lp["text_offset"] == [len(prompt) + where[f] for f in firsts]
        streamed = []
        for ch in s.client.completions.create(stream=True, **body):
            if ch.choices[0].logprobs:
                streamed += ch.choices[0].logprobs.text_offset
        assert streamed == lp["text_offset"]


def test_logprobs_end_with_the_text_a_stop_string_cut(tmp_path):
    with serving(tmp_path, *PLAIN) as s:
        full = _frames_comp(s, REPEAT_PROMPT, max_tokens=16, temperature=0)["text"]
        stop = full[next(i for i in range(3, len(full) - 2) if "\ufffd" not in full[i:i + 2]):][:2]
        for stream in (False, True):
            body = {"model": s.model, "prompt": REPEAT_PROMPT, "max_tokens": 16, "temperature": 0, "logprobs": 1,
                    "stop": stop, "stream": stream}
            if stream:
                tokens, text = [], ""
                for ch in s.client.completions.create(**body):
                    text += ch.choices[0].text
                    tokens += ch.choices[0].logprobs.tokens if ch.choices[0].logprobs else []
            else:
                c = s.client.completions.create(**body).choices[0]
                tokens, text = c.logprobs.tokens, c.text
            assert text == full[:full.find(stop)], stream
            assert b"".join(_token_bytes(t) for t in tokens).decode("utf-8", "replace") == text, stream
        chat = s.client.chat.completions.create(model=s.model, messages=[{"role": "user", "content": "abc"}],
                                                max_tokens=16, temperature=0, logprobs=True)
        whole = chat.choices[0].message.content
        stop = next(ch for ch in whole[3:] if ch != "\ufffd")
        cut = s.client.chat.completions.create(model=s.model, messages=[{"role": "user", "content": "abc"}],
                                               max_tokens=16, temperature=0, logprobs=True, stop=stop)
        kept = [bytes(t.bytes) for t in cut.choices[0].logprobs.content]
        assert b"".join(kept).decode("utf-8", "replace") == whole[:whole.find(stop)]


# ----------------------------------------------------------------------------- SIGTERM

def test_sigterm_during_a_request_saves_the_counts_and_exits_0(tmp_path):
    port = _free_port()
    usage = tmp_path / "usage.bin"
    cmd = [sys.executable, "-m", "verispec.cli", "serve", "--model", str(fixture_dir(**FIXTURE)),
           "--port", str(port), "--context", "512", "--vocab-usage", str(usage), *DRAFTED]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        end = time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.communicate()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            assert time.monotonic() < end, "the server did not start"
            time.sleep(0.2)
        s = Served(port)
        first = s.client.completions.create(model=s.model, prompt="abc abc abc", max_tokens=6, temperature=0)
        chunks, usage_seen = [], []
        stream = s.client.chat.completions.create(model=s.model, messages=[{"role": "user", "content": "abc abc"}],
                                                  max_tokens=30, temperature=0, stream=True,
                                                  stream_options={"include_usage": True})
        for ch in stream:
            if ch.choices:
                chunks.append(ch.choices[0])
                if len(chunks) == 3:
                    proc.send_signal(signal.SIGTERM)
                    time.sleep(0.5)
                    with pytest.raises(httpx.ConnectError):     # no longer accepting
                        httpx.get(f"http://127.0.0.1:{port}/health")
            if ch.usage:
                usage_seen.append(ch.usage)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert chunks[-1].finish_reason == "length" and usage_seen[0].completion_tokens == 30  # finished cleanly
    assert "[verispec" in err and "run:" in err and "[verispec" not in out    # report on stderr only
    v = VocabList(259, 0)
    assert v.load(usage)
    counted = first.usage.prompt_tokens + first.usage.completion_tokens + usage_seen[0].prompt_tokens + 30
    assert int(v.counts().sum()) == counted
