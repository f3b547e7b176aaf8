"""The agent's image sources: a local directory and Glance (a recording test server)."""

import json
import os
import uuid

import pytest

from acceld.agent import images
from tests.conftest import make_conf
from tests.support.glance import GlanceServer

IMAGE = str(uuid.uuid4())


@pytest.fixture
def glance():
    server = GlanceServer().start()
    yield server
    server.stop()


def glance_source(tmp_path, url):
    conf = make_conf(str(tmp_path), glance__auth_type="none", glance__endpoint_override=url)
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


@pytest.mark.parametrize("image_id", [str(uuid.uuid4()), "../../etc/passwd", ""])
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
    assert ("GET", f"/v2/images/{IMAGE}/file") == glance.store.requests[-1][:2]
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
