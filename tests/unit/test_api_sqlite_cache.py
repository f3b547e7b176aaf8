"""The API's SQLite connections keep a small page cache (acceld.db.engine.
API_SQLITE_CACHE_KIB): each pooled connection holds its own for as long as it is pooled,
and four of SQLite's default 2,000 KiB stayed in the worker after large lists. Other
processes keep SQLite's default."""

from __future__ import annotations

from sqlalchemy import text

from acceld.db import engine
from acceld.db.engine import API_SQLITE_CACHE_KIB, from_config
from tests.conftest import make_conf


def _cache_size(db: engine.Database) -> int:
    with db.read() as conn:
        return conn.execute(text("PRAGMA cache_size")).scalar_one()


def test_from_config_bounds_each_connection_s_page_cache(tmp_path) -> None:
    conf = make_conf(str(tmp_path))
    small, default = from_config(conf, sqlite_cache_kib=API_SQLITE_CACHE_KIB), from_config(conf)
    try:
        assert _cache_size(small) == -API_SQLITE_CACHE_KIB
        assert _cache_size(default) == -2000  # SQLite's
    finally:
        small.dispose()
        default.dispose()


def test_the_api_worker_opens_it_small(tmp_path, monkeypatch) -> None:
    # (acceld.wsgi.api's LazyApplication passes the same; importing it starts an application.)
    from acceld.services import api_server

    asked: list[int | None] = []
    real = engine.from_config

    def recording(conf, **kwargs):  # type: ignore[no-untyped-def]
        asked.append(kwargs.get("sqlite_cache_kib"))
        return real(conf, **kwargs)

    monkeypatch.setattr(engine, "from_config", recording)
    conf = make_conf(str(tmp_path))
    api_server._Gunicorn(conf).load()
    assert asked == [API_SQLITE_CACHE_KIB]
