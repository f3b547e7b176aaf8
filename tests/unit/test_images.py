"""The agent's image sources: a local directory and Glance (a recording test server)."""

import json
import logging
import os
import tempfile
import uuid

import pytest

from acceld import request_ids
from acceld.agent import images
from tests.conftest import make_conf
from tests.support.glance import GlanceServer

IMAGE = str(uuid.uuid4())


@pytest.fixture
def glance():
    server = GlanceServer().start()
    yield server
    server.stop()


def glance_source(tmp_path, url, **extra):
    conf = make_conf(str(tmp_path), glance__auth_type="none", glance__endpoint_override=url,
                     glance__connect_retry_delay=0.01, glance__status_code_retry_delay=0.01,
                     **extra)
    source = images.from_config(conf)
    assert isinstance(source, images.GlanceSource)
    return source


def test_directory_source(tmp_path):
    (tmp_path / IMAGE).write_bytes(b"bits")
    (tmp_path / f"{IMAGE}.json").write_text(json.dumps({"accel:function_id": "f1"}))
    source = images.from_config(make_conf(str(tmp_path), agent__bitstream_dir=str(tmp_path)))
    with source.open(IMAGE.upper()) as path:
        assert open(path, "rb").read() == b"bits"
    assert os.path.exists(tmp_path / IMAGE)  # a local file is used in place, never removed
    assert source.find_by_function("f1") == IMAGE


@pytest.mark.parametrize("image_id", ["227e589c-1037-47ed-afa6-c3e10cd01197", "../../etc/passwd", ""])
def test_directory_source_unknown_or_bad_id_is_400(tmp_path, image_id):
    source = images.DirectorySource(str(tmp_path))
    with pytest.raises(images.ImageError) as info:
        with source.open(image_id):
            pass
    assert info.value.status == 400


def test_directory_function_lookup_needs_exactly_one(tmp_path):
    source = images.DirectorySource(str(tmp_path))
    with pytest.raises(images.ImageError, match="No image"):
        source.find_by_function("f1")
    for _ in range(2):
        (tmp_path / f"{uuid.uuid4()}.json").write_text(json.dumps({"accel:function_id": "f1"}))
    with pytest.raises(images.ImageError, match="Several images") as info:
        source.find_by_function("f1")
    assert info.value.status == 400


def test_glance_download(tmp_path, glance):
    glance.store.add(IMAGE, b"\x00bitstream" * 1000, **{"accel:function_id": "fn"})
    source = glance_source(tmp_path, glance.url)
    with source.open(IMAGE) as path:
        assert open(path, "rb").read() == b"\x00bitstream" * 1000
        assert oct(os.stat(path).st_mode & 0o777) == oct(0o600)
    assert not os.path.exists(path)  # the temporary copy is gone
    assert [("GET", f"/v2/images/{IMAGE}"), ("GET", f"/v2/images/{IMAGE}/file")] == [
        r[:2] for r in glance.store.requests]
    assert source.find_by_function("fn") == IMAGE
    assert "accel%3Afunction_id=fn" in glance.store.requests[-1][1]


@pytest.mark.parametrize("case, status, words", [
    ("unknown", 400, "not found in Glance"),
    ("no data", 400, "no data"),
    ("corrupt", 502, "corrupted"),
])
def test_glance_failures(tmp_path, glance, case, status, words):
    if case == "no data":
        glance.store.add(IMAGE, None)
    elif case == "corrupt":
        glance.store.add(IMAGE, b"data")
        glance.store.corrupt.add(IMAGE)
    source = glance_source(tmp_path, glance.url)
    with pytest.raises(images.ImageError) as info:
        with source.open(IMAGE):
            pass
    assert info.value.status == status
    assert words in info.value.message


@pytest.mark.parametrize("status", [500, 503])
def test_glance_answering_5xx_is_503(tmp_path, glance, status):
    """Glance there but unavailable is an outage a bind waits out (503), not a failure."""
    glance.store.add(IMAGE, b"data", **{"accel:function_id": "fn"})
    glance.store.failing = status
    source = glance_source(tmp_path, glance.url)
    with pytest.raises(images.ImageError) as info:
        with source.open(IMAGE):
            pass
    assert info.value.status == 503 and "Glance" in info.value.message
    with pytest.raises(images.ImageError) as info:
        source.find_by_function("fn")
    assert info.value.status == 503


def test_glance_unreachable_is_503(tmp_path, glance):
    url = glance.url
    glance.stop()
    source = glance_source(tmp_path, url)
    with pytest.raises(images.ImageError) as info:
        with source.open(IMAGE):
            pass
    assert info.value.status == 503


def test_no_source_configured_is_400(tmp_path):
    source = images.from_config(make_conf(str(tmp_path)))
    with pytest.raises(images.ImageError) as info:
        with source.open(IMAGE):
            pass
    assert info.value.status == 400
    assert "bitstream_dir" in info.value.message


def _refused(source) -> images.ImageError:
    """The error opening IMAGE raises; the caller's block (the program) never runs."""
    ran = []
    with pytest.raises(images.ImageError) as info:
        with source.open(IMAGE):
            ran.append(True)
    assert ran == []
    return info.value


@pytest.mark.parametrize("algo", ["sha512", "sha256"])
def test_glance_multihash_mismatch_refuses_the_image(tmp_path, glance, algo):
    """Data whose MD5 matches Content-MD5 but not the record's os_hash_value: refused
    (not only Content-MD5 is checked), with both hashes named; the temporary copy gone."""
    glance.store.hash_algo = algo
    glance.store.add(IMAGE, b"bits" * 100)
    glance.store.wrong_multihash.add(IMAGE)
    before = set(os.listdir(tempfile.gettempdir()))
    error = _refused(glance_source(tmp_path, glance.url))
    assert error.status == 502
    assert f"its {algo} " in error.message and "os_hash_value" in error.message
    assert "nothing was programmed" in error.message
    assert not [n for n in set(os.listdir(tempfile.gettempdir())) - before
                if n.startswith(f"acceld-{IMAGE}")]


def test_glance_multihash_is_checked_and_used(tmp_path, glance):
    """The same image, right multihash: served; wrong data for the multihash alone (a
    Glance that sends no Content-MD5 would let it through otherwise) is refused."""
    glance.store.add(IMAGE, b"bits" * 100)
    source = glance_source(tmp_path, glance.url)
    with source.open(IMAGE) as path:
        assert open(path, "rb").read() == b"bits" * 100
    glance.store.corrupt.add(IMAGE)  # a byte more than Glance hashed
    assert "sha512" in _refused(source).message


def test_glance_unknown_hash_algorithm_is_refused(tmp_path, glance):
    glance.store.hash_algo = "sha512"
    glance.store.add(IMAGE, b"bits")
    source = glance_source(tmp_path, glance.url)
    record = glance.store.record(IMAGE)
    glance.store.record = lambda image_id: {**record, "os_hash_algo": "blake9"}  # type: ignore[method-assign]
    error = _refused(source)
    assert error.status == 502 and "'blake9'" in error.message
    # The data was never fetched.
    assert ("GET", f"/v2/images/{IMAGE}/file") not in [r[:2] for r in glance.store.requests]


def test_glance_without_multihash_falls_back_to_content_md5(tmp_path, glance, caplog):
    """An image from before Glance's multihash: its Content-MD5 still guards it."""
    glance.store.add(IMAGE, b"old bits")
    glance.store.no_multihash.add(IMAGE)
    source = glance_source(tmp_path, glance.url)
    with caplog.at_level(logging.INFO), source.open(IMAGE) as path:
        assert open(path, "rb").read() == b"old bits"
    assert "only its Content-MD5 is checked" in caplog.text
    glance.store.corrupt.add(IMAGE)
    assert "Content-MD5" in _refused(source).message


def test_glance_calls_carry_the_global_request_id(tmp_path, glance):
    glance.store.add(IMAGE, b"bits", **{"accel:function_id": "fn"})
    source = glance_source(tmp_path, glance.url)
    global_id = request_ids.new()
    with request_ids.bound(global_id):
        source.find_by_function("fn")
        with source.open(IMAGE):
            pass
    sent = [{k.lower(): v for k, v in headers.items()}.get("x-openstack-request-id")
            for _, _, headers in glance.store.requests]
    assert sent == [global_id] * 3


def test_glance_retries_are_keystoneauths(tmp_path, glance):
    """[glance] status_code_retries: one 503 is retried by keystoneauth; with none, the
    503 is the answer (an outage the bind waits out)."""
    glance.store.add(IMAGE, b"bits")
    glance.store.failing = 503
    source = glance_source(tmp_path, glance.url, glance__status_code_retries=0)
    assert _refused(source).status == 503
    assert len(glance.store.requests) == 1
    glance.store.requests.clear()
    source = glance_source(tmp_path, glance.url, glance__status_code_retries=2)
    assert _refused(source).status == 503
    assert len(glance.store.requests) == 3
