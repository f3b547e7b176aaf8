"""Reading request bodies and query strings, writing JSON responses."""

from __future__ import annotations

import uuid as uuidlib
from typing import Any, Callable, Iterable

import falcon
import orjson
from jsonschema import Draft202012Validator

from acceld import fastcheck
from acceld.api import errors

_JSON_TYPES = ("application/json",)
_NUL = "\x00"
# Integer ids are 32-bit signed columns on every backend; PostgreSQL fails a larger one.
MAX_ID = 2**31 - 1


def read_json(req: falcon.Request) -> Any:
    """The request body as JSON; 415 for another media type, 413 if too big, 400 if malformed.

    Kept on the request once read, so that a responder run again after a deadlock
    (acceld.db.retry) reads the same document."""
    cached = getattr(req.context, "acceld_json_body", _UNREAD)
    if cached is not _UNREAD:
        return cached
    req.context.acceld_json_body = document = _read_json(req)
    return document


_UNREAD = object()


def _read_json(req: falcon.Request) -> Any:
    content_type = (req.content_type or "").split(";", 1)[0].strip().lower()
    if content_type and content_type not in _JSON_TYPES and not content_type.endswith("+json"):
        raise errors.UnsupportedMediaType(
            f"Content-Type {content_type!r} is not supported; send application/json.")
    limit = req.context.api.conf.api.max_request_body_size
    # Falcon's bounded stream is bounded by Content-Length: a chunked body has none, and
    # the server's reader ends it at its last chunk (the loop buffered it, within limit).
    chunked = req.content_length is None and req.get_header("Transfer-Encoding")
    raw = (req.stream if chunked else req.bounded_stream).read(limit + 1)
    if len(raw) > limit:
        raise errors.PayloadTooLarge(f"Request body exceeds the limit of {limit} bytes.")
    if not raw.strip():
        raise errors.BadRequest("The request body is empty; a JSON document is required.")
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise errors.BadRequest(f"Malformed JSON in request body: {exc}") from None
    # JSON can carry a NUL only as the escape \u0000 (a raw one is malformed), so the walk
    # runs only when the bytes hold one.
    if b"\\u0000" in raw and _holds_nul(document):
        raise errors.BadRequest("The request body holds a NUL character (\\u0000) in a string; "
                                "no field accepts one.")
    return document


def _holds_nul(document: Any) -> bool:
    """True when a string (key or value) anywhere in ``document`` contains NUL: PostgreSQL
    refuses NUL in text, so it must be a 400 before any query, on every backend alike."""
    stack = [document]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _NUL in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def validate(validator: Draft202012Validator, document: Any, what: str = "request body") -> None:
    """400 naming the first problem found, with its location.

    Valid documents (nearly every request) are passed by a compiled check (see
    acceld.fastcheck, about a tenth of the cost); anything it does not pass goes to
    jsonschema, which decides and words the message."""
    error = fastcheck.first_error(validator, document)
    if error is None:
        return
    best = _deepest(error)
    where = "/".join(str(p) for p in best.absolute_path)
    location = f" at '{where}'" if where else ""
    raise errors.BadRequest(f"Invalid {what}{location}: {best.message}")


def _deepest(error):  # type: ignore[no-untyped-def]
    while error.context:
        error = min(error.context, key=lambda e: (-len(e.absolute_path), e.message))
    return error


def query_params(req: falcon.Request, allowed: Iterable[str]) -> dict[str, str]:
    """The query string as a dict; 400 for a parameter the endpoint does not know or repeats,
    or a value holding NUL (PostgreSQL refuses it in text)."""
    allowed = set(allowed)
    params: dict[str, str] = {}
    for name, value in falcon.uri.parse_query_string(req.query_string, keep_blank=True,
                                                     csv=False).items():
        if name not in allowed:
            known = ", ".join(sorted(allowed)) or "none"
            raise errors.BadRequest(f"Unknown query parameter {name!r}; allowed: {known}.")
        if isinstance(value, list):
            raise errors.BadRequest(f"Query parameter {name!r} is given more than once.")
        if _NUL in value:
            raise errors.BadRequest(f"Query parameter {name!r} holds a NUL character.")
        params[name] = value
    return params


def int_id(value: str, what: str) -> int:
    """A digits-only id from a query string as an int; 400 beyond the columns' range."""
    number = int(value)
    if number > MAX_ID:
        raise errors.BadRequest(f"Invalid {what}: {value} is out of range (at most {MAX_ID}).")
    return number


def respond(resp: falcon.Response, body: Any, status: int = 200) -> None:
    resp.status = status
    resp.content_type = falcon.MEDIA_JSON
    resp.data = orjson.dumps(body)


def list_body(key: str, batches: Iterable[Iterable[Any]],
              to_wire: Callable[[Any], Any]) -> list[bytes]:
    """The document ``{key: [to_wire(row), ...]}`` as pieces, byte for byte what
    :func:`respond` would send, built one batch of rows at a time: a list of thousands
    then holds its encoded pieces and one batch's dicts, not every row, every dict and
    the whole document at once (which stay in the worker's heap as fragments after)."""
    pieces = [b'{"' + key.encode() + b'":[']
    for batch in batches:
        encoded = orjson.dumps([to_wire(row) for row in batch])
        if len(encoded) > 2:  # not an empty batch
            pieces.append(encoded[1:-1] if len(pieces) == 1 else b"," + encoded[1:-1])
    pieces.append(b"]}")
    return pieces


def respond_pieces(resp: falcon.Response, pieces: list[bytes], status: int = 200) -> None:
    """Answer with a JSON document given as pieces (:func:`list_body`), with its
    Content-Length: the server writes them as they are, never joined."""
    resp.status = status
    resp.content_type = falcon.MEDIA_JSON
    resp.content_length = sum(len(piece) for piece in pieces)
    resp.stream = pieces


def no_content(resp: falcon.Response, status: int = 204) -> None:
    resp.status = status
    resp.data = b""


def base_url(req: falcon.Request) -> str:
    """Scheme, host and port for links: ``[api] public_endpoint``, else the request's.

    Computed once per request: list endpoints build a link per row."""
    base = req.context.get("base_url")
    if base is None:
        configured = req.context.api.conf.api.public_endpoint
        base = req.context.base_url = configured.rstrip("/") if configured else req.prefix
    return base


def self_link(req: falcon.Request, collection: str, ident: str) -> list[dict[str, str]]:
    return [{"href": f"{base_url(req)}/accelerator/v2/{collection}/{ident}", "rel": "self"}]


def timestamp(value) -> str | None:  # type: ignore[no-untyped-def]
    """UTC timestamps as upstream writes them: ISO 8601 with +00:00.

    ``value`` is a naive UTC datetime, or the text SQLite stores it as
    (``YYYY-MM-DD HH:MM:SS[.ffffff]``) when a list reads driver rows directly
    (acceld.db.rows.driver_rows); both give the same string."""
    if value is None:
        return None
    if value.__class__ is str:
        text = f"{value[:10]}T{value[11:]}"
        # datetime.isoformat() leaves out a zero fraction; so does this.
        return (text[:-7] if text.endswith(".000000") else text) + "+00:00"
    return value.isoformat() + "+00:00"


def canonical_uuid(value: str) -> str:
    """Stored uuids are lower-case with dashes. A value that is no uuid becomes "", which
    matches no row, so the caller answers 404 with the value the client sent. (Not the value
    itself: MariaDB compares with PAD SPACE, so '<uuid> ' would find '<uuid>'.)"""
    try:
        return str(uuidlib.UUID(value))
    except ValueError:
        return ""
