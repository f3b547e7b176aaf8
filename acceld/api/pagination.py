"""``limit`` and ``marker`` on list endpoints, OpenStack style (Nova, Ironic).

A page holds at most ``limit`` rows after the row the ``marker`` names, in id order.
``limit`` is a whole number from 1; a larger one than ``[api] max_limit`` is lowered to
it, and a request without one gets pages of ``max_limit`` rows. When more rows follow,
the body carries ``<collection>_links: [{"rel": "next", "href": ...}]`` (what Nova
sends and openstacksdk follows); the last page has no such member.
"""

from __future__ import annotations

from typing import NamedTuple
from urllib.parse import urlencode

import falcon

from acceld.api import errors, wire

PARAMS = ("limit", "marker")
# More digits than this cannot be a page size anyone means; it is clamped without int(),
# which refuses strings over 4,300 digits.
_MAX_DIGITS = 9


class Page(NamedTuple):
    limit: int
    marker: str | None  # as the client sent it; the handler resolves it


def requested(req: falcon.Request, params: dict[str, str]) -> Page:
    """The page a request asks for; 400 for a limit that is not a whole number from 1."""
    max_limit = req.context.api.conf.api.max_limit
    raw = params.get("limit")
    if raw is None:
        return Page(max_limit, params.get("marker"))
    if not (raw.isascii() and raw.isdigit()):
        raise errors.BadRequest(f"Invalid value {raw!r} for query parameter limit: expected "
                                "a whole number from 1.")
    if len(raw.lstrip("0")) > _MAX_DIGITS:
        return Page(max_limit, params.get("marker"))
    limit = int(raw)
    if limit < 1:
        raise errors.BadRequest(f"Invalid value {raw!r} for query parameter limit: expected "
                                "a whole number from 1.")
    return Page(min(limit, max_limit), params.get("marker"))


def next_links(req: falcon.Request, collection: str, params: dict[str, str],
               last: str) -> list[dict[str, str]]:
    """The ``next`` link: the same query with the marker moved to the page's last row."""
    query = urlencode({**{k: v for k, v in params.items() if k != "marker"}, "marker": last})
    href = f"{wire.base_url(req)}/accelerator/v2/{collection}?{query}"
    return [{"rel": "next", "href": href}]
