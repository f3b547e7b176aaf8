"""acceld.serving.request_framing: how many bytes the connection loop waits for before a request
is served. Cut at every byte, a body is incomplete until its last byte is in."""

from __future__ import annotations

import pytest

from acceld.serving.request_framing import (ChunkedMalformed, ChunkedTooLarge, Framing,
                                    chunked_end, framing)

HEAD = b"POST /x HTTP/1.1\r\nHost: h"


@pytest.mark.parametrize("headers, expected", [
    (b"", Framing()),
    (b"\r\nContent-Length: 12", Framing(content_length=12)),
    (b"\r\ncontent-length:  0 ", Framing(content_length=0)),
    (b"\r\nTransfer-Encoding: chunked", Framing(chunked=True)),
    (b"\r\nTRANSFER-ENCODING: Chunked\r\nExpect: 100-Continue",
     Framing(chunked=True, expect_continue=True)),
    (b"\r\nContent-Length: 5\r\nExpect: 100-continue",
     Framing(content_length=5, expect_continue=True)),
    # What a parser must refuse is served at once, never waited for.
    (b"\r\nContent-Length: 5\r\nContent-Length: 5", Framing(ambiguous=True)),
    (b"\r\nContent-Length: 5\r\nTransfer-Encoding: chunked", Framing(ambiguous=True)),
    (b"\r\nTransfer-Encoding: gzip, chunked", Framing(ambiguous=True)),
    (b"\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked", Framing(ambiguous=True)),
    (b"\r\nContent-Length: +5", Framing(ambiguous=True)),
    (b"\r\nContent-Length: 5 5", Framing(ambiguous=True)),
    (b"\r\nContent-Length: " + b"9" * 19, Framing(ambiguous=True)),
])
def test_framing_from_the_head(headers: bytes, expected: Framing) -> None:
    assert framing(HEAD + headers) == expected


def test_only_a_body_is_waited_for() -> None:
    assert not Framing().has_body
    assert not Framing(content_length=0).has_body
    assert Framing(content_length=1).has_body and Framing(chunked=True).has_body


@pytest.mark.parametrize("body", [
    b"0\r\n\r\n",
    b"5\r\nhello\r\n0\r\n\r\n",
    b"5;name=value\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    b"A\r\n0123456789\r\n0\r\nX-Trailer: yes\r\nY: z\r\n\r\n",
    b"3\r\n\r\n\r\r\n0\r\n\r\n",  # the data may hold CRLF: sizes count, not lines
])
def test_a_chunked_body_ends_after_its_last_chunk_and_trailers(body: bytes) -> None:
    start = 7
    buffer = b"x" * start + body + b"GET /next HTTP/1.1\r\n"
    assert chunked_end(buffer, start, 1024) == start + len(body)
    for cut in range(start, start + len(body)):
        assert chunked_end(buffer[:cut], start, 1024) is None, cut


@pytest.mark.parametrize("size", [b"0x5", b"+5", b"-5", b"5_0", b"zz", b"", b"1" * 17])
def test_a_chunk_size_that_is_not_hex_digits_is_malformed(size: bytes) -> None:
    with pytest.raises(ChunkedMalformed):
        chunked_end(size + b"\r\nhello\r\n0\r\n\r\n", 0, 1 << 40)


def test_a_chunk_size_line_without_its_end_is_malformed_once_too_long() -> None:
    assert chunked_end(b"5" * 100, 0, 1024) is None  # may still end
    with pytest.raises(ChunkedMalformed):
        chunked_end(b"5" * 5000, 0, 1024)


def test_a_chunked_body_over_the_cap_is_refused_from_its_sizes() -> None:
    assert chunked_end(b"400\r\n", 0, 1024) is None  # 1024 bytes announced: within
    with pytest.raises(ChunkedTooLarge):
        chunked_end(b"400\r\n" + b"a" * 1024 + b"\r\n1\r\n", 0, 1024)
    with pytest.raises(ChunkedTooLarge):  # refused before any of its data arrived
        chunked_end(b"100000\r\n", 0, 1024)
