"""The operator's web dashboard at ``/dashboard``: static HTML, CSS and JavaScript.

The page is the same for everyone and holds no data: the browser reads the public
API with the caller's own token (or none in the all-in-one's noauth), so the page
shows each user what policy lets them see and adds no new way in. Nothing is
fetched from elsewhere and there is no build step; the files live in
``acceld/dashboard/static`` and are read once per process.
"""

from __future__ import annotations

import functools
from importlib import resources

import falcon

from acceld.api import errors

PATHS = ("/dashboard", "/accelerator/dashboard")
# The files the page is made of, by the name the URL uses, with their media type.
ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
}
# Only this origin's own files and API: no inline script, no framing, no referrer.
HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; "
                                "img-src 'self' data:; connect-src 'self'; "
                                "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


# Ports Chromium refuses to open (ERR_UNSAFE_PORT; Firefox: "This address is restricted"),
# each checked against a real Chromium (tests/integration/test_observability.py). The API's
# customary 6666 is among them, so the dashboard needs another port (or a proxy).
BROWSER_REFUSED_PORTS = frozenset({
    1, 7, 9, 11, 13, 15, 17, 19, 20, 21, 22, 23, 25, 37, 42, 43, 53, 69, 77, 79, 87, 95,
    101, 102, 103, 104, 109, 110, 111, 113, 115, 117, 119, 123, 135, 137, 139, 143, 161,
    179, 389, 427, 465, 512, 513, 514, 515, 526, 530, 531, 532, 540, 548, 554, 556, 563,
    587, 601, 636, 989, 990, 993, 995, 1719, 1720, 1723, 2049, 3659, 4045, 5060,
    5061, 6000, 6566, 6665, 6666, 6667, 6668, 6669, 6697, 10080})
# What `make run` uses (API, then conductor and agent on the next two): none refused.
BROWSER_PORT = 6680


def announcement(root: str, port: int) -> str:
    """The all-in-one's ``acceld dashboard: <url>`` line, saying so when browsers will
    refuse the port rather than leaving the operator to an ERR_UNSAFE_PORT page."""
    line = f"acceld dashboard: {root}/dashboard"
    if port in BROWSER_REFUSED_PORTS:
        line += (f" (browsers refuse port {port}, ERR_UNSAFE_PORT: `acceld all --port "
                 f"{BROWSER_PORT}` or `make run` serve it where they open it)")
    return line


def is_dashboard_path(path: str) -> bool:
    """GETs of these paths need no token (acceld.api.auth lets them past auth_token)."""
    return any(path == p or path.startswith(p + "/") for p in PATHS)


@functools.lru_cache(maxsize=None)
def _asset(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


class _Dashboard:
    def on_get(self, req: falcon.Request, resp: falcon.Response, asset: str = "index.html"
               ) -> None:
        raw = req.env.get("PATH_INFO", "")
        if raw.endswith("/") and raw.rstrip("/") in PATHS:
            # The page names its files relative to /dashboard (no slash): send it there.
            raise falcon.HTTPMovedPermanently(raw.rstrip("/"))
        media_type = ASSETS.get(asset)
        if media_type is None:
            raise errors.NotFound(f"The dashboard has no file {asset!r}.")
        resp.content_type = media_type
        resp.set_headers(HEADERS)
        resp.data = _asset(asset)

    on_head = on_get


def install(app: falcon.App) -> None:
    resource = _Dashboard()
    for path in PATHS:
        app.add_route(path, resource)
        app.add_route(path + "/{asset}", resource)
