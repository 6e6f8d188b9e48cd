"""Text <-> ids for a checkpoint directory: tokenizer.json through Hugging Face `tokenizers`,
the chat template through jinja2 (rendered the way transformers renders it), the stop ids,
and a streaming detokenizer that never emits half a character.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import tokenizers

from .errors import ModelFormatError

REPLACEMENT = "\ufffd"  # what a decoder produces for bytes that are not (yet) valid UTF-8


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelFormatError(f"{path} is damaged: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ModelFormatError(f"{path} is damaged: not a JSON object")
    return data


def _token_content(tok: Any) -> str | None:
    # tokenizer_config.json writes special tokens as "str" or {"content": "str", ...}
    if isinstance(tok, dict):
        tok = tok.get("content")
    return tok if isinstance(tok, str) else None


def _id_list(value: Any) -> list[int] | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    return None


class Tokenizer:
    def __init__(
        self,
        tok: tokenizers.Tokenizer,
        eos_ids: set[int],
        chat_template: str | None = None,
        special_tokens: dict[str, str] | None = None,
    ):
        self._tok = tok
        self.eos_ids: set[int] = set(eos_ids)
        self.chat_template = chat_template
        # bos_token / eos_token / pad_token / unk_token, as the template sees them
        self.special_tokens: dict[str, str] = dict(special_tokens or {})
        self._template = None  # compiled on first use: a broken template must not block --prompt-ids

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> Tokenizer | None:
        """Load tokenizer.json and friends from a checkpoint directory; None without tokenizer.json."""
        d = Path(model_dir)
        if not (d / "tokenizer.json").is_file():
            return None
        try:
            tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
        except Exception as e:       # the Rust library's own exception type
            raise ModelFormatError(f"{d / 'tokenizer.json'} is damaged: {e}") from None
        tcfg = _read_json(d / "tokenizer_config.json")
        special = {}
        for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
            content = _token_content(tcfg.get(name))
            if content is not None:
                special[name] = content
        return cls(tok, _find_eos_ids(d, tok, tcfg), _find_chat_template(d, tcfg), special)

    # ------------------------------------------------------------------ ids

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        # transformers' default is to keep special tokens; so is ours
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # ------------------------------------------------------------------ chat

    @property
    def has_chat_template(self) -> bool:
        return self.chat_template is not None

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, **template_kwargs: Any
    ) -> str:
        """Render the checkpoint's chat template. Extra keyword arguments (tools,
        enable_thinking, ...) are passed to the template as variables, as transformers does."""
        if self.chat_template is None:
            raise ValueError("this checkpoint has no chat template (tokenizer_config.json / chat_template.jinja)")
        if self._template is None:
            self._template = _compile_template(self.chat_template)
        variables = dict(self.special_tokens)
        variables.update(template_kwargs)
        return self._template.render(
            messages=messages, add_generation_prompt=add_generation_prompt, **variables
        )


def _find_eos_ids(d: Path, tok: tokenizers.Tokenizer, tcfg: dict) -> set[int]:
    """generation_config.json eos_token_id, else config.json's (or its text_config's), else
    tokenizer_config.json's eos_token looked up in the vocabulary. Empty when none says."""
    gen = _read_json(d / "generation_config.json")
    ids = _id_list(gen.get("eos_token_id"))
    if ids is None:
        cfg = _read_json(d / "config.json")
        ids = _id_list(cfg.get("eos_token_id"))
        if ids is None and isinstance(cfg.get("text_config"), dict):
            ids = _id_list(cfg["text_config"].get("eos_token_id"))
    if ids is None:
        content = _token_content(tcfg.get("eos_token"))
        tid = tok.token_to_id(content) if content is not None else None
        ids = [tid] if tid is not None else []
    return set(ids)


def _find_chat_template(d: Path, tcfg: dict) -> str | None:
    # Newer checkpoints ship chat_template.jinja; it wins, as in transformers.
    path = d / "chat_template.jinja"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    tpl = tcfg.get("chat_template")
    if isinstance(tpl, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        tpl = named.get("default")
    return tpl if isinstance(tpl, str) else None


def _compile_template(source: str):
    """Compile like transformers does: a sandboxed, immutable jinja2 environment with
    trim_blocks/lstrip_blocks, loop controls, tojson without ASCII escaping, and the
    raise_exception / strftime_now helpers."""
    import jinja2
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _Generation(Extension):
        # transformers' {% generation %} ... {% endgeneration %} marks assistant text for
        # masks; for rendering it is a pass-through.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ValueError(f"chat template does not compile: {e}") from e


class StreamDecoder:
    """Incremental detokenizer: push ids one at a time, get back the text they complete.

    Text that ends in U+FFFD (an incomplete UTF-8 sequence from byte-level pieces) is held
    back until a later id completes it or flush() is called. Each step decodes a short
    window: the ids of the last emitted piece (for context, e.g. a leading-space rule) plus
    the new ids, and emits what the new ids added. For decoders whose output is the byte
    concatenation of the pieces (ByteLevel, byte fallback) the emitted pieces concatenate
    to decode(all ids) exactly, because a piece is emitted only at a clean UTF-8 boundary.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # start of the context window (the last emitted piece's ids)
        self._read = 0  # ids before this index are emitted

    @property
    def ids(self) -> list[int]:
        return list(self._ids)

    def held_chars(self, token_id: int) -> int:
        """How many characters the held ids (pushed, text not out yet: an incomplete UTF-8 sequence)
        become before the text of `token_id`, pushed next; a token that completes or continues a
        held character begins where that character does. 0 where the pieces are not byte-level."""
        held = self._ids[self._read:]
        if not held:
            return 0
        parts = [token_bytes(self._tokenizer, t) for t in held + [token_id]]
        if any(not b for b in parts):
            return 0
        # every byte belongs to one character (a valid one, or one U+FFFD per maximal invalid part),
        # and which one the token's first byte joins depends on nothing after it: it is the last
        return len(bytes(sum(parts[:-1], []) + parts[-1][:1]).decode("utf-8", "replace")) - 1

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    def push(self, token_id: int) -> str:
        self._ids.append(int(token_id))
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT):
            self._prefix, self._read = self._read, len(self._ids)
            return new_text[len(prefix_text) :]
        return ""

    def flush(self) -> str:
        """Emit whatever is held back (possibly ending in U+FFFD) and start a fresh window."""
        if self._read == len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return new_text[len(prefix_text) :]


def _byte_decoder() -> dict[str, int]:
    # GPT-2's byte-level alphabet (the ByteLevel pre-tokenizer of `tokenizers`): char -> byte
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_BYTE_DECODER = _byte_decoder()


def token_bytes(tokenizer: Tokenizer, t: int) -> list[int] | None:
    """A token's bytes: its piece through the byte-level alphabet when it is written in it,
    else its text's UTF-8; None when neither says (a piece of a byte-fallback model, say)."""
    piece = tokenizer._tok.id_to_token(t)
    if piece is not None and piece and all(c in _BYTE_DECODER for c in piece) and tokenizer.token_to_id(piece) == t:
        special = tokenizer.decode([t]) == piece       # an added token is its own text
        if not special:
            return [_BYTE_DECODER[c] for c in piece]
    s = tokenizer.decode([t])
    return None if "\ufffd" in s else list(s.encode("utf-8"))
