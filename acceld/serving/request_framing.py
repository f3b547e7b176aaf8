"""Where a request's body ends, from its head and the bytes buffered after it.

The connection loop (acceld.serving.connection_loop) reads a request's body before any
application thread sees the request, as it reads heads: it must know how many bytes
to wait for. This is only that count; the HTTP parser that serves the request
(gunicorn's, or the internal server's) still parses and checks the head and body
itself, and refuses what this module calls ambiguous.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CRLF = b"\r\n"
# Bytes of one chunk-size line (the size in hex, extensions) the loop waits for.
MAX_CHUNK_LINE = 4096
_HEX_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")  # no sign, prefix or "_" (int() takes them)


@dataclass(frozen=True)
class Framing:
    """What a head says of its body."""

    content_length: int | None = None
    chunked: bool = False
    # Framing a parser must refuse (several or malformed Content-Length, Content-Length
    # with Transfer-Encoding, a coding other than chunked alone): served at once, so that
    # the parser answers 400 without waiting for a body.
    ambiguous: bool = False
    expect_continue: bool = False  # the client waits for "100 Continue" before its body

    @property
    def has_body(self) -> bool:
        return self.chunked or bool(self.content_length)


def framing(head: bytes) -> Framing:
    """The body framing of ``head`` (request line and headers, without the blank line)."""
    lengths: list[str] = []
    codings: list[str] = []
    expect = False
    for line in head.split(CRLF)[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        name = name.lower()
        if name == b"content-length":
            lengths.append(value.strip().decode("latin-1"))
        elif name == b"transfer-encoding":
            codings += [c.strip().lower() for c in value.decode("latin-1").split(",")]
        elif name == b"expect":
            expect = value.strip().lower() == b"100-continue"
    if codings:
        if lengths or codings != ["chunked"]:
            return Framing(ambiguous=True)
        return Framing(chunked=True, expect_continue=expect)
    if not lengths:
        return Framing()
    if len(lengths) > 1 or not (lengths[0].isdigit() and len(lengths[0]) < 19):
        return Framing(ambiguous=True)
    return Framing(content_length=int(lengths[0]), expect_continue=expect)


class ChunkedTooLarge(Exception):
    """A chunked body over the cap (the bytes counted are its data, not its framing)."""


class ChunkedMalformed(Exception):
    """A chunk-size line that is not one: the parser refuses it from the buffered bytes."""


def chunked_end(buffer: bytes | bytearray, start: int, cap: int) -> int | None:
    """The offset in ``buffer`` just past the chunked body that begins at ``start`` (its
    last chunk and trailers included), or None while it is incomplete."""
    at = start
    data = 0
    while True:
        line_end = buffer.find(CRLF, at, at + MAX_CHUNK_LINE)
        if line_end < 0:
            if len(buffer) - at >= MAX_CHUNK_LINE:
                raise ChunkedMalformed("chunk-size line too long")
            return None
        size_text = bytes(buffer[at:line_end]).split(b";", 1)[0].strip()
        if not _HEX_SIZE.fullmatch(size_text):
            raise ChunkedMalformed(f"chunk size {size_text[:20]!r}")
        size = int(size_text, 16)
        data += size
        if data > cap:
            raise ChunkedTooLarge(f"chunked body over {cap} bytes")
        at = line_end + len(CRLF)
        if size == 0:
            return _trailers_end(buffer, at)
        if len(buffer) < at + size + len(CRLF):
            return None
        at += size + len(CRLF)  # the chunk's data and the CRLF after it


def _trailers_end(buffer: bytes | bytearray, at: int) -> int | None:
    """Past the trailer section (often empty: one CRLF) that starts at ``at``."""
    if buffer[at:at + 2] == CRLF:
        return at + 2
    end = buffer.find(CRLF + CRLF, at, at + MAX_CHUNK_LINE)
    if end < 0:
        if len(buffer) - at >= MAX_CHUNK_LINE:
            raise ChunkedMalformed("trailers too long")
        return None
    return end + 4
