"""A reference for where each byte of a UTF-8 stream lands in its decoded text, computed over the
whole string (the engine computes it token by token: StreamDecoder.held_chars)."""

import codecs


def char_of_byte(b: bytes) -> list[int]:
    """For each byte of b, the index of the character it belongs to in b.decode("utf-8", "replace")
    (an invalid sequence is one U+FFFD per maximal part, as the decoder reports them)."""
    bad = {}

    def note(e):
        bad[e.start] = e.end
        return "\ufffd", e.end
    codecs.register_error("verispec-test-note", note)
    text = b.decode("utf-8", "verispec-test-note")
    out, j, c = [], 0, 0
    while j < len(b):
        end = bad.get(j) or j + (1 if b[j] < 0x80 else 2 if b[j] < 0xE0 else 3 if b[j] < 0xF0 else 4)
        out += [c] * (end - j)
        j, c = end, c + 1
    assert c == len(text)
    return out
