"""The public API's edge (acceld.api.edge): /healthcheck with the database check, the
proxy headers behind a TLS-terminating proxy, CORS. Driven through the full WSGI
pipeline (acceld.api.app.wsgi_app), in process."""

from __future__ import annotations

from pathlib import Path

import pytest
from falcon import testing
from oslo_config import cfg

from acceld.api.app import wsgi_app
from acceld.db.engine import Database
from tests.conftest import make_conf


def _client(tmp_path: Path, db: Database, **overrides) -> testing.TestClient:  # type: ignore[no-untyped-def]
    conf = make_conf(str(tmp_path), **overrides)
    return testing.TestClient(wsgi_app(conf, db, None))


def test_healthcheck_checks_the_database_without_credentials(tmp_path, sqlite_db) -> None:
    client = _client(tmp_path, sqlite_db)
    result = client.simulate_get("/healthcheck")
    assert result.status_code == 200
    assert result.text == "database OK"
    assert client.simulate_head("/healthcheck").status_code == 204


def test_healthcheck_needs_no_token_under_keystone(tmp_path, sqlite_db) -> None:
    from keystonemiddleware.auth_token import _opts as authtoken_opts

    conf = make_conf(str(tmp_path), auth_strategy="keystone")
    for group, opts in authtoken_opts.list_opts():
        conf.register_opts(opts, group=group)
    conf.set_override("www_authenticate_uri", "http://127.0.0.1:9/identity",
                      group="keystone_authtoken")
    client = testing.TestClient(wsgi_app(conf, sqlite_db, None))
    assert client.simulate_get("/healthcheck").status_code == 200
    # ... while the API itself still wants one.
    assert client.simulate_get("/v2/device_profiles").status_code == 401


def test_unreachable_database_is_503_without_details(tmp_path) -> None:
    (tmp_path / "not-a-file").mkdir()  # SQLite cannot open a directory: "unreachable"
    down = Database(f"sqlite:///{tmp_path}/not-a-file")
    try:
        client = _client(tmp_path, down)
        result = client.simulate_get("/healthcheck")
        assert result.status_code == 503
        assert result.text == "database unavailable"
        assert "sqlite" not in result.text.lower() and "not-a-file" not in result.text
        json = client.simulate_get("/healthcheck", headers={"Accept": "application/json"})
        assert json.status_code == 503
        assert json.json == {"detailed": False, "reasons": ["database unavailable"]}
        # The operator may ask for the details.
        detailed = _client(tmp_path, down, healthcheck__detailed=True).simulate_get(
            "/healthcheck", headers={"Accept": "application/json"})
        assert detailed.status_code == 503
        assert "OperationalError" in detailed.json["reasons"][0]["details"]
    finally:
        down.dispose()


def test_operator_backends_run_beside_the_database_check(tmp_path, sqlite_db) -> None:
    flag = tmp_path / "healthcheck_disable"
    client = _client(tmp_path, sqlite_db, healthcheck__backends=["disable_by_file"],
                     healthcheck__disable_by_file_path=str(flag))
    assert client.simulate_get("/healthcheck").status_code == 200
    flag.write_text("")
    result = client.simulate_get("/healthcheck")
    assert result.status_code == 503
    assert "DISABLED BY FILE" in result.text and "database OK" in result.text


@pytest.mark.parametrize("parsing, scheme", [(True, "https"), (False, "http")])
def test_links_follow_x_forwarded_proto_when_enabled(tmp_path, sqlite_db, parsing,
                                                     scheme) -> None:
    client = _client(tmp_path, sqlite_db,
                     oslo_middleware__enable_proxy_headers_parsing=parsing)
    result = client.simulate_get("/", headers={"X-Forwarded-Proto": "https",
                                               "X-Forwarded-Host": "cloud.example.com"})
    assert result.status_code == 200
    v2 = next(v for v in result.json["versions"] if v["id"] == "v2")
    host = "cloud.example.com" if parsing else "falconframework.org"
    assert v2["links"][0]["href"] == f"{scheme}://{host}/accelerator/v2"


def test_cors_answers_configured_origins_only(tmp_path, sqlite_db) -> None:
    client = _client(tmp_path, sqlite_db, cors__allowed_origin=["https://dash.example.com"])
    preflight = {"Access-Control-Request-Method": "PATCH",
                 "Access-Control-Request-Headers": "X-Auth-Token, OpenStack-API-Version"}
    allowed = client.simulate_options("/v2/accelerator_requests", headers={
        "Origin": "https://dash.example.com", **preflight})
    assert allowed.headers["Access-Control-Allow-Origin"] == "https://dash.example.com"
    assert "PATCH" in allowed.headers["Access-Control-Allow-Methods"]
    other = client.simulate_options("/v2/accelerator_requests", headers={
        "Origin": "https://evil.example.com", **preflight})
    assert "Access-Control-Allow-Origin" not in other.headers
    listed = client.simulate_get("/v2/device_profiles",
                                 headers={"Origin": "https://dash.example.com"})
    assert listed.status_code == 200
    assert listed.headers["Access-Control-Allow-Origin"] == "https://dash.example.com"
    assert "X-OpenStack-Request-ID" in listed.headers["Access-Control-Expose-Headers"]


def test_no_cors_headers_without_configured_origins(tmp_path, sqlite_db) -> None:
    client = _client(tmp_path, sqlite_db)
    result = client.simulate_get("/v2/device_profiles",
                                 headers={"Origin": "https://dash.example.com"})
    assert result.status_code == 200
    assert "Access-Control-Allow-Origin" not in result.headers


def test_cors_from_a_named_section_alone_is_configured(tmp_path) -> None:
    """oslo's CORS also reads [cors.<name>] sections: one of those alone must put the
    middleware in (the edge leaves it out when nothing is configured)."""
    from acceld import config
    from acceld.api import edge
    from acceld.conf import middleware

    path = tmp_path / "acceld.conf"
    path.write_text("[cors.dashboard]\nallowed_origin = https://dash.example.com\n")
    conf = config.load([], config_files=[str(path)], conf=cfg.ConfigOpts())
    middleware.register_opts(conf)
    assert edge._cors_configured(conf)
    plain = config.load([], config_files=[], conf=cfg.ConfigOpts())
    middleware.register_opts(plain)
    assert not edge._cors_configured(plain)
