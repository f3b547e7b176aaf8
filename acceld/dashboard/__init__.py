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
