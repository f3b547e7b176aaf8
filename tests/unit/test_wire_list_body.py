"""wire.list_body: a list encoded batch by batch is byte for byte the document
wire.respond would send for the whole list at once."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from acceld.api.wire import list_body

ROWS = st.lists(st.tuples(st.text(max_size=8), st.integers(-2**63, 2**63 - 1), st.none() | st.booleans()),
                max_size=12)


def to_wire(row: tuple) -> dict:
    name, number, flag = row
    return {"name": name, "n": number, "flag": flag, "links": [{"href": name}]}


@given(st.lists(ROWS, max_size=6))
def test_batches_join_into_the_whole_document(batches: list[list[tuple]]) -> None:
    rows = [row for batch in batches for row in batch]
    pieces = list_body("devices", iter(batches), to_wire)
    assert b"".join(pieces) == orjson.dumps({"devices": [to_wire(r) for r in rows]})
    assert all(pieces)  # no empty write


def test_no_rows() -> None:
    assert b"".join(list_body("arqs", [], to_wire)) == b'{"arqs":[]}'
