"""Tokenizer: byte-level and trained-BPE round trips, streaming detokenization, eos sources,
chat templates."""

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verispec.fixture import BYTE_VOCAB, CHATML_TEMPLATE, write_byte_tokenizer
from utf8_ref import char_of_byte
from verispec.tokenizer import StreamDecoder, Tokenizer

SAMPLE = (
    "The quick brown fox jumps over the lazy dog. héllo ✓ 日本語のテキスト, emoji 🦊🚀, "
    "Ünïcödé, Ελληνικά, русский текст, العربية. def f(x):\n    return x ** 2  # tabs\tand spaces\n"
)


@pytest.fixture(scope="module")
def byte_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("byte_tok")
    write_byte_tokenizer(d)
    return d


@pytest.fixture(scope="module")
def byte_tok(byte_dir):
    return Tokenizer.from_dir(byte_dir)


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    """A byte-level BPE (as Qwen's) trained at test time on a few KB of text."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    d = tmp_path_factory.mktemp("bpe_tok")
    rng = random.Random(0)
    words = SAMPLE.split(" ")
    corpus = [" ".join(rng.choice(words) for _ in range(40)) for _ in range(100)]  # ~ 20 KB
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    tok.save(str(d / "tokenizer.json"))
    return d


@pytest.fixture(scope="module")
def bpe_tok(bpe_dir):
    return Tokenizer.from_dir(bpe_dir)


# ---------------------------------------------------------------- byte tokenizer


def test_byte_ids_are_bytes(byte_tok):
    assert byte_tok.vocab_size == BYTE_VOCAB
    s = "héllo ✓ 日本"
    assert byte_tok.encode(s) == list(s.encode("utf-8"))
    assert byte_tok.encode("\x00\x7f") == [0, 127]
    assert [byte_tok.token_to_id(t) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")] == [256, 257, 258]
    assert byte_tok.encode("<|im_start|>user") == [256] + list(b"user")
    assert byte_tok.decode([256, 104, 105, 257]) == "<|im_start|>hi<|im_end|>"
    assert byte_tok.decode([256, 104, 105, 257], skip_special_tokens=True) == "hi"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_byte_round_trip_arbitrary_unicode(byte_tok, s):
    ids = byte_tok.encode(s)
    assert byte_tok.decode(ids) == s
    if not any(t in s for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")):
        assert ids == list(s.encode("utf-8"))  # (a special token's text encodes to its id)


def test_special_token_text_round_trips(byte_tok):
    s = "a<|im_end|>b<|endoftext|>"
    assert byte_tok.encode(s) == [97, 257, 98, 258]
    assert byte_tok.decode(byte_tok.encode(s)) == s


def test_byte_tokenizer_loads_in_transformers(byte_dir):
    # the files are a valid HF tokenizer directory, and transformers renders the same prompt
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(byte_dir))
    ours = Tokenizer.from_dir(byte_dir)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "héllo ✓"}]
    for agp in (True, False):
        assert ours.apply_chat_template(msgs, add_generation_prompt=agp) == hf.apply_chat_template(
            msgs, add_generation_prompt=agp, tokenize=False
        )
    assert hf.encode(SAMPLE, add_special_tokens=False) == ours.encode(SAMPLE)


# ---------------------------------------------------------------- trained BPE


def test_bpe_round_trip(bpe_tok):
    ids = bpe_tok.encode(SAMPLE)
    assert len(ids) < len(SAMPLE.encode("utf-8"))  # merges happened
    assert bpe_tok.decode(ids) == SAMPLE
    for s in ["", " ", "unseen wörds ✓✓ 本日", "🦊" * 3]:
        assert bpe_tok.decode(bpe_tok.encode(s)) == s


# ---------------------------------------------------------------- streaming


def _stream(tok, ids, skip=False):
    sd = StreamDecoder(tok, skip_special_tokens=skip)
    pieces = [sd.push(i) for i in ids]
    return pieces, sd.flush()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40) | st.text(max_size=12).map(lambda x: x.encode("utf-8")[:-1]))
def test_held_chars_put_each_token_where_its_character_begins(byte_tok, data):
    """Before each byte token is pushed, the text out so far plus held_chars is the index of the
    character that byte belongs to in the whole stream's decoded text (broken, completed and
    unfinished sequences alike)."""
    sd, out = StreamDecoder(byte_tok), ""
    where = char_of_byte(data)
    for i, b in enumerate(data):
        assert len(out) + sd.held_chars(b) == where[i], (data, i)
        out += sd.push(b)


def test_held_chars_cases(byte_tok):
    cases = [(b"\xe4\xbd", 0xA0, 0),     # completes the character the held bytes began
             (b"\xe9", ord("G"), 1),       # breaks a held sequence: it becomes one U+FFFD first
             (b"\xf0\x9f", 0x98, 0),      # continues it, still unfinished
             (b"", ord("a"), 0)]
    for held, nxt, want in cases:
        sd = StreamDecoder(byte_tok)
        assert all(sd.push(b) == "" for b in held)
        assert sd.held_chars(nxt) == want, (held, nxt)


@pytest.mark.parametrize("which", ["byte_tok", "bpe_tok"])
def test_stream_equals_decode_on_text(which, request):
    tok = request.getfixturevalue(which)
    ids = tok.encode(SAMPLE)
    pieces, tail = _stream(tok, ids)
    assert "".join(pieces) + tail == tok.decode(ids) == SAMPLE
    assert tail == ""
    assert not any("\ufffd" in p for p in pieces)  # never half a character


def test_stream_holds_back_partial_utf8(byte_tok):
    ids = list("✓".encode("utf-8"))  # 3 bytes
    sd = StreamDecoder(byte_tok)
    assert [sd.push(i) for i in ids] == ["", "", "✓"]
    assert sd.flush() == ""
    sd = StreamDecoder(byte_tok)
    assert sd.push(ids[0]) == "" and sd.push(ids[1]) == ""
    assert sd.flush() == byte_tok.decode(ids[:2])  # an unfinished sequence comes out at flush


@pytest.mark.parametrize("which", ["byte_tok", "bpe_tok"])
@pytest.mark.parametrize("skip", [False, True])
def test_stream_equals_decode_on_random_ids(which, skip, request):
    # random ids include lone continuation bytes, truncated sequences and special tokens
    tok = request.getfixturevalue(which)
    rng = random.Random(1)
    multibyte = tok.encode("héllo ✓ 日本 🦊")
    for trial in range(300):
        n = rng.randrange(0, 40)
        ids = [
            rng.choice(multibyte) if rng.random() < 0.5 else rng.randrange(tok.vocab_size) for _ in range(n)
        ]
        pieces, tail = _stream(tok, ids, skip)
        assert "".join(pieces) + tail == tok.decode(ids, skip_special_tokens=skip), (trial, ids)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=60), st.integers(0, 2**32))
def test_stream_equals_decode_byte_property(byte_tok, s, seed):
    ids = byte_tok.encode(s)
    rng = random.Random(seed)
    for _ in range(rng.randrange(3)):  # splice in a random byte somewhere
        ids.insert(rng.randrange(len(ids) + 1), rng.randrange(256))
    pieces, tail = _stream(byte_tok, ids)
    assert "".join(pieces) + tail == byte_tok.decode(ids)


# ---------------------------------------------------------------- eos sources


def _tok_dir(tmp_path, byte_dir, files: dict):
    d = tmp_path / "m"
    d.mkdir()
    (d / "tokenizer.json").write_bytes((byte_dir / "tokenizer.json").read_bytes())
    for name, content in files.items():
        (d / name).write_text(content if isinstance(content, str) else json.dumps(content))
    return d


def test_eos_from_generation_config(tmp_path, byte_dir):
    d = _tok_dir(
        tmp_path,
        byte_dir,
        {
            "generation_config.json": {"eos_token_id": [257, 258]},
            "config.json": {"eos_token_id": 5},
            "tokenizer_config.json": {"eos_token": "<|im_start|>"},
        },
    )
    assert Tokenizer.from_dir(d).eos_ids == {257, 258}


def test_eos_from_config_int_and_text_config(tmp_path, byte_dir):
    d = _tok_dir(
        tmp_path,
        byte_dir,
        {"generation_config.json": {"eos_token_id": None}, "config.json": {"eos_token_id": 258}},
    )
    assert Tokenizer.from_dir(d).eos_ids == {258}
    (d / "config.json").write_text(json.dumps({"text_config": {"eos_token_id": [7]}}))
    assert Tokenizer.from_dir(d).eos_ids == {7}


def test_eos_from_tokenizer_config(tmp_path, byte_dir):
    d = _tok_dir(tmp_path, byte_dir, {"tokenizer_config.json": {"eos_token": {"content": "<|endoftext|>"}}})
    assert Tokenizer.from_dir(d).eos_ids == {258}


def test_eos_none_anywhere(tmp_path, byte_dir):
    d = _tok_dir(tmp_path, byte_dir, {})
    tok = Tokenizer.from_dir(d)
    assert tok.eos_ids == set()
    assert not tok.has_chat_template
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


def test_fixture_byte_tokenizer_eos(byte_dir):
    # write_byte_tokenizer alone: eos comes from tokenizer_config.json's eos_token
    assert Tokenizer.from_dir(byte_dir).eos_ids == {257}


def test_from_dir_without_tokenizer_json(tmp_path):
    assert Tokenizer.from_dir(tmp_path) is None
    (tmp_path / "tokenizer_config.json").write_text("{}")
    assert Tokenizer.from_dir(tmp_path) is None


# ---------------------------------------------------------------- chat templates


def test_chatml_template_renders(byte_tok):
    assert byte_tok.has_chat_template
    msgs = [{"role": "user", "content": "hi ✓"}, {"role": "assistant", "content": "yo"}]
    assert (
        byte_tok.apply_chat_template(msgs)
        == "<|im_start|>user\nhi ✓<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n<|im_start|>assistant\n"
    )
    assert byte_tok.apply_chat_template(msgs[:1], add_generation_prompt=False) == "<|im_start|>user\nhi ✓<|im_end|>\n"
    ids = byte_tok.encode(byte_tok.apply_chat_template(msgs[:1]))
    assert ids[0] == 256 and ids.count(257) == 1


def test_template_raise_exception(byte_tok):
    import jinja2

    with pytest.raises(jinja2.exceptions.TemplateError, match="unknown role: robot"):
        byte_tok.apply_chat_template([{"role": "robot", "content": "x"}])


def test_template_environment_like_transformers(tmp_path, byte_dir):
    # trim_blocks/lstrip_blocks, tojson without ASCII escaping, bos/eos variables, extra
    # kwargs, loop controls, {% generation %}; the .jinja file wins over tokenizer_config.
    tpl = (
        "{{ bos_token }}|{{ eos_token }}\n"
        "    {% for m in messages %}\n"
        "{% if loop.index > 2 %}{% break %}{% endif %}\n"
        "{% generation %}{{ m | tojson }}{% endgeneration %}\n"
        "    {% endfor %}\n"
        "{% if enable_thinking is defined %}T={{ enable_thinking }}{% endif %}"
    )
    d = _tok_dir(
        tmp_path,
        byte_dir,
        {
            "tokenizer_config.json": {"chat_template": "WRONG", "bos_token": "<s>", "eos_token": "</s>"},
            "chat_template.jinja": tpl,
        },
    )
    tok = Tokenizer.from_dir(d)
    msgs = [{"role": "user", "content": "é"}, {"role": "user", "content": "2"}, {"role": "user", "content": "3"}]
    out = tok.apply_chat_template(msgs, enable_thinking=False)
    # trim_blocks eats the newline after each block tag, lstrip_blocks the indent before one
    assert out == '<s>|</s>\n{"role": "user", "content": "é"}{"role": "user", "content": "2"}T=False'
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(d))
    assert hf.apply_chat_template(msgs, tokenize=False, enable_thinking=False) == out


def test_template_list_form_and_sandbox(tmp_path, byte_dir):
    import jinja2

    d = _tok_dir(
        tmp_path,
        byte_dir,
        {
            "tokenizer_config.json": {
                "chat_template": [
                    {"name": "tool_use", "template": "TOOLS"},
                    {"name": "default", "template": "{{ messages[0].content }}"},
                ]
            }
        },
    )
    assert Tokenizer.from_dir(d).apply_chat_template([{"role": "user", "content": "x"}]) == "x"
    # the sandbox refuses attribute access to internals
    (d / "chat_template.jinja").write_text("{{ messages.__class__.__mro__ }}")
    with pytest.raises(jinja2.exceptions.SecurityError):
        Tokenizer.from_dir(d).apply_chat_template([])
    (d / "chat_template.jinja").write_text("{% for %}")
    with pytest.raises(ValueError, match="does not compile"):
        Tokenizer.from_dir(d).apply_chat_template([])


def test_chatml_constant_is_the_written_template(byte_dir):
    cfg = json.loads((byte_dir / "tokenizer_config.json").read_text())
    assert cfg["chat_template"] == CHATML_TEMPLATE and cfg["eos_token"] == "<|im_end|>"
