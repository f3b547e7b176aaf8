"""Version documents, microversion negotiation, and the behaviour every endpoint shares."""

import pytest

from acceld.api import microversion
from tests.helpers import fault, version


@pytest.fixture
def client(sqlite_db, conf):
    from falcon import testing

    from acceld.api.app import build_app

    return testing.TestClient(build_app(conf, sqlite_db))


@pytest.mark.parametrize("path", ["/", "/accelerator", "/accelerator/"])
def test_version_list(client, path):
    result = client.simulate_get(path)
    assert result.status_code == 200
    body = result.json
    by_id = {v["id"]: v for v in body["versions"]}
    assert by_id["v2"]["status"] == "CURRENT"
    assert by_id["v1"]["status"] == "DEPRECATED"
    assert by_id["v2"]["min_version"] == "2.0"
    assert by_id["v2"]["max_version"] == str(microversion.MAX_VERSION)
    assert by_id["v2"]["links"] == [{"href": "http://falconframework.org/accelerator/v2",
                                     "rel": "self"}]
    assert body["default_version"]["id"] == "v2"
    assert result.headers["X-OpenStack-Request-Id"].startswith("req-")


@pytest.mark.parametrize("path", ["/accelerator/v2", "/accelerator/v2/", "/v2"])
def test_v2_document(client, path):
    result = client.simulate_get(path)
    assert result.status_code == 200
    assert result.json["id"] == "v2.0"
    assert result.json["status"] == "CURRENT"
    assert result.json["min_version"] == "2.0"
    assert result.json["max_version"] == str(microversion.MAX_VERSION)
    assert "version" not in result.json  # keystoneauth would read it as a version object
    assert result.headers["OpenStack-API-Minimum-Version"] == "2.0"


def test_public_endpoint_used_in_links(sqlite_db, tmp_path):
    from falcon import testing

    from acceld.api.app import build_app
    from tests.conftest import make_conf

    conf = make_conf(str(tmp_path), api__public_endpoint="https://cloud.example.com:6666/")
    result = testing.TestClient(build_app(conf, sqlite_db)).simulate_get("/accelerator/v2")
    assert result.json["links"][0]["href"] == "https://cloud.example.com:6666/accelerator/v2/"


@pytest.mark.parametrize("header, expected", [
    (None, "2.0"),
    ("accelerator 2.2", "2.2"),
    ("accelerator 2.0", "2.0"),
    ("2.3", "2.3"),
    ("accelerator latest", str(microversion.MAX_VERSION)),
    ("compute 2.80, accelerator 2.1", "2.1"),
    ("compute 2.80", "2.0"),
])
def test_microversion_negotiated(client, header, expected):
    headers = {"OpenStack-API-Version": header} if header else {}
    result = client.simulate_get("/accelerator/v2/device_profiles", headers=headers)
    assert result.status_code == 200
    assert result.headers["OpenStack-API-Version"] == f"accelerator {expected}"
    assert result.headers["OpenStack-API-Minimum-Version"] == "2.0"
    assert result.headers["OpenStack-API-Maximum-Version"] == str(microversion.MAX_VERSION)
    assert result.headers["Vary"] == "OpenStack-API-Version"


@pytest.mark.parametrize("header", ["accelerator 2.99", "accelerator 3.0", "accelerator 1.0",
                                    "accelerator two", "accelerator 2", "2.x"])
def test_microversion_not_acceptable(client, header):
    result = client.simulate_get("/v2/device_profiles",
                                 headers={"OpenStack-API-Version": header})
    assert result.status_code == 406
    assert f"[2.0, {microversion.MAX_VERSION}]" in fault(result)
    assert result.headers["OpenStack-API-Maximum-Version"] == str(microversion.MAX_VERSION)
    assert result.headers["Content-Type"] == "application/json"


def test_versions_ordered_and_documented():
    versions = [microversion.Version.parse(v) for v, _ in microversion.VERSIONS]
    assert versions == sorted(versions)
    assert all(summary for _, summary in microversion.VERSIONS)
    import pathlib

    history = (pathlib.Path(microversion.__file__).parent / "rest_api_version_history.md").read_text()
    for v, _ in microversion.VERSIONS:
        assert f"## {v}" in history


def test_unknown_route_is_json_404(client):
    result = client.simulate_get("/v2/no_such_thing")
    assert result.status_code == 404
    assert "could not be found" in fault(result)
    assert result.headers["X-OpenStack-Request-Id"].startswith("req-")


def test_v1_is_not_served(client):
    assert client.simulate_get("/accelerator/v1/accelerators").status_code == 404


def test_wrong_method_is_json_405(client):
    result = client.simulate_put("/v2/device_profiles", json=[])
    assert result.status_code == 405
    assert "not allowed" in fault(result)
    assert "GET" in result.headers["Allow"]


def test_body_over_limit_is_413(client, conf):
    big = b"[" + b" " * (conf.api.max_request_body_size + 10) + b"]"
    result = client.simulate_post("/v2/device_profiles", body=big,
                                  headers={"Content-Type": "application/json"})
    assert result.status_code == 413


def test_non_json_body_is_415(client):
    result = client.simulate_post("/v2/device_profiles", body="name=x",
                                  headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert result.status_code == 415
    assert "application/json" in fault(result)


def test_request_id_on_errors_and_success(client):
    ids = {client.simulate_get("/v2/device_profiles").headers["X-OpenStack-Request-Id"]
           for _ in range(3)}
    assert len(ids) == 3


def test_unexpected_error_is_500_without_traceback(sqlite_db, conf, monkeypatch):
    from falcon import testing

    from acceld.api.app import build_app
    from acceld.db import device_profiles

    def boom(*args, **kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(device_profiles, "list_profiles", boom)
    result = testing.TestClient(build_app(conf, sqlite_db)).simulate_get("/v2/device_profiles",
                                                                         headers=version("2.0"))
    assert result.status_code == 500
    assert "secret internals" not in result.text
    assert "Traceback" not in result.text
    import json

    assert json.loads(result.json["error_message"])["faultcode"] == "Server"
