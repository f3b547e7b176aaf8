"""Where the agent gets bitstream and firmware images: Glance, or a local directory.

- ``[agent] bitstream_dir`` set: the image with id X is the file ``<dir>/X``;
  its properties (for ``accel:function_id`` lookups) are in ``<dir>/X.json``.
  For clouds without Glance, and for the all-in-one.
- else ``[glance]`` configured (``auth_type``, plus ``endpoint_override`` when
  there is no catalog): the agent reads the image's record (``GET /v2/images/{id}``),
  downloads ``GET /v2/images/{id}/file`` into a private temporary file and checks it
  against the record's multihash (``os_hash_algo``/``os_hash_value``) and the
  ``Content-MD5`` Glance sends; a mismatch refuses the image before anything is
  programmed with it.

Failures carry the HTTP status the caller should see: 400 for what the client
can fix (an unknown image, an image without data), 502 or 503 when the image
service itself failed.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import tempfile
import uuid as uuidlib
from typing import Iterator, Protocol

from oslo_config import cfg

from acceld import request_ids
from acceld.clients import deadline as deadlines

LOG = logging.getLogger(__name__)

FUNCTION_ID_PROPERTY = "accel:function_id"
_CHUNK = 1024 * 1024


class ImageError(Exception):
    """An image could not be provided; ``status`` is what the API answers."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ImageSource(Protocol):
    def open(self, image_id: str) -> contextlib.AbstractContextManager[str]:
        """A context giving a local path to the image's data, cleaned up on exit."""

    def find_by_function(self, function_id: str) -> str:
        """The id of the one image whose ``accel:function_id`` property is ``function_id``."""


def check_image_id(image_id: str) -> str:
    """Image ids are uuids (Glance's form); anything else is refused, never used as a path."""
    try:
        return str(uuidlib.UUID(image_id))
    except (ValueError, TypeError, AttributeError):
        raise ImageError(400, f"Image id {image_id!r} is not a uuid.") from None


def _one_image(function_id: str, ids: list[str]) -> str:
    if not ids:
        raise ImageError(400, f"No image has {FUNCTION_ID_PROPERTY}={function_id}.")
    if len(ids) > 1:
        raise ImageError(400, f"Several images have {FUNCTION_ID_PROPERTY}={function_id} "
                              f"({', '.join(sorted(ids))}); name one with accel:bitstream_id.")
    return ids[0]


class DirectorySource:
    """Images as files named by id in one directory."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    @contextlib.contextmanager
    def open(self, image_id: str) -> Iterator[str]:
        path = os.path.join(self.directory, check_image_id(image_id))
        if not os.path.isfile(path):
            raise ImageError(400, f"Image {image_id} was not found in the bitstream "
                                  f"directory {self.directory}.")
        yield path

    def find_by_function(self, function_id: str) -> str:
        ids = []
        try:
            names = sorted(os.listdir(self.directory))
        except OSError as exc:
            raise ImageError(503, f"The bitstream directory cannot be read: {exc}") from None
        for name in names:
            if not name.endswith(".json"):
                continue
            try:
                with open(os.path.join(self.directory, name)) as handle:
                    props = json.load(handle)
            except (OSError, ValueError):
                LOG.warning("Ignoring unreadable image properties %s", name)
                continue
            if isinstance(props, dict) and props.get(FUNCTION_ID_PROPERTY) == function_id:
                ids.append(name[:-len(".json")])
        return _one_image(function_id, ids)


class GlanceSource:
    """Images from Glance's v2 API through a keystoneauth adapter (``[glance]`` options)."""

    def __init__(self, conf: cfg.ConfigOpts, timeout: float) -> None:
        from keystoneauth1 import loading

        auth = loading.load_auth_from_conf_options(conf, "glance")
        session = loading.load_session_from_conf_options(conf, "glance", auth=auth)
        self.adapter = loading.load_adapter_from_conf_options(
            conf, "glance", session=session, auth=auth,
            service_type=conf.glance.service_type or "image")
        deadlines.watch(session.session)
        # The whole fetch (record, download, retries) in all; [glance] timeout bounds each
        # attempt's connect and read. A Glance that trickles is cut off here.
        self.timeout = timeout

    def _get(self, path: str, **kwargs):  # type: ignore[no-untyped-def]
        from keystoneauth1 import exceptions as ks_exc

        try:
            # The request (or bind job) the image is fetched for: Glance's lines name it.
            return self.adapter.get(path, raise_exc=False,
                                    global_request_id=request_ids.current_global_id(),
                                    **kwargs)
        except deadlines.DeadlinePassed as exc:
            raise self._too_slow(exc) from None
        except ks_exc.EndpointNotFound as exc:
            raise ImageError(503, f"No Glance endpoint: {exc}; set [glance] "
                                  "endpoint_override or the catalog options.") from None
        except (ks_exc.ConnectFailure, ks_exc.ConnectTimeout, ks_exc.RequestTimeout) as exc:
            raise ImageError(503, f"Glance could not be reached: {exc}") from None
        except ks_exc.ClientException as exc:
            passed = deadlines.passed_in(exc)
            if passed is not None:
                raise self._too_slow(passed) from None
            raise ImageError(502, f"Glance request failed: {exc}") from None

    @staticmethod
    def _too_slow(exc: deadlines.DeadlinePassed) -> ImageError:
        """503, like unreachable: a bind waits for Glance instead of failing."""
        return ImageError(503, f"Glance did not answer in time: {exc}")

    @contextlib.contextmanager
    def open(self, image_id: str) -> Iterator[str]:
        image_id = check_image_id(image_id)
        fd, path = tempfile.mkstemp(prefix=f"acceld-{image_id}-")
        try:
            try:
                with deadlines.bounded(self.timeout, "Glance"):
                    self._download(image_id, fd)
            except deadlines.DeadlinePassed as exc:
                raise self._too_slow(exc) from None
            yield path  # the deadline bounds the fetch, not what the caller does with it
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def _download(self, image_id: str, fd: int) -> None:
        """The image's data into ``fd``, checked (before anything is programmed with it)."""
        with os.fdopen(fd, "wb") as out:
            expected = self._expected_hash(image_id)
            resp = self._get(f"/v2/images/{image_id}/file", stream=True)
            try:
                self._check(resp, image_id)
                digests = _Digests(expected, resp.headers.get("Content-MD5"))
                for chunk in resp.iter_content(_CHUNK):
                    digests.update(chunk)
                    out.write(chunk)
            finally:
                resp.close()
        digests.verify(image_id)

    def _expected_hash(self, image_id: str) -> tuple[str, str] | None:
        """The image's multihash (``os_hash_algo``, ``os_hash_value``) from its record; None
        for an image Glance has none for (uploaded before Glance 17, or no data yet)."""
        resp = self._get(f"/v2/images/{image_id}")
        try:
            self._check(resp, image_id)
            record = resp.json()
        except ValueError:
            raise ImageError(502, f"Glance's record of image {image_id} was not "
                                  "understood.") from None
        finally:
            resp.close()
        if not isinstance(record, dict):
            raise ImageError(502, f"Glance's record of image {image_id} was not understood.")
        algo, value = record.get("os_hash_algo"), record.get("os_hash_value")
        if not algo or not value:
            LOG.info("Image %s has no multihash in Glance: only its Content-MD5 is checked",
                     image_id)
            return None
        if not isinstance(algo, str) or not isinstance(value, str) \
                or algo.lower() not in hashlib.algorithms_available:
            raise ImageError(502, f"Image {image_id} cannot be verified: Glance hashes it "
                                  f"with {algo!r}, which this agent does not know.")
        return algo.lower(), value.lower()

    @staticmethod
    def _check(resp, image_id: str) -> None:  # type: ignore[no-untyped-def]
        if resp.status_code == 200:
            return
        if resp.status_code == 404:
            raise ImageError(400, f"Image {image_id} was not found in Glance.")
        if resp.status_code == 204:
            raise ImageError(400, f"Image {image_id} has no data in Glance (not active).")
        if resp.status_code in (401, 403):
            raise ImageError(502, f"Glance refused the agent's credentials for image "
                                  f"{image_id} ({resp.status_code}); check [glance].")
        # 5xx: Glance is there but unavailable (restarting, overloaded): like unreachable,
        # 503, so that a bind waits for it instead of failing.
        raise ImageError(503 if resp.status_code >= 500 else 502,
                         f"Glance answered {resp.status_code} for image {image_id}.")

    def find_by_function(self, function_id: str) -> str:
        try:
            with deadlines.bounded(self.timeout, "Glance"):
                resp = self._get("/v2/images", params={FUNCTION_ID_PROPERTY: function_id})
        except deadlines.DeadlinePassed as exc:
            raise self._too_slow(exc) from None
        if resp.status_code != 200:
            raise ImageError(503 if resp.status_code >= 500 else 502,
                             f"Glance answered {resp.status_code} listing images with "
                             f"{FUNCTION_ID_PROPERTY}={function_id}.")
        try:
            images = resp.json()["images"]
            ids = [img["id"] for img in images
                   if img.get(FUNCTION_ID_PROPERTY, function_id) == function_id]
        except (ValueError, KeyError, TypeError):
            raise ImageError(502, "Glance's image list was not understood.") from None
        return _one_image(function_id, ids)


class _Digests:
    """What a download is checked against: Glance's multihash (``os_hash_algo`` and
    ``os_hash_value`` of the image record, sha512 by default) and the ``Content-MD5`` it
    sends with the data. Either one that differs refuses the image."""

    def __init__(self, multihash: tuple[str, str] | None, content_md5: str | None) -> None:
        self.multihash = multihash
        self.content_md5 = content_md5
        self._hash = hashlib.new(multihash[0]) if multihash else None
        self._md5 = hashlib.md5(usedforsecurity=False) if content_md5 else None

    def update(self, chunk: bytes) -> None:
        if self._hash is not None:
            self._hash.update(chunk)
        if self._md5 is not None:
            self._md5.update(chunk)

    def verify(self, image_id: str) -> None:
        if self.multihash is not None and self._hash is not None:
            algo, expected = self.multihash
            got = self._hash.hexdigest()
            if got != expected:
                raise ImageError(502, f"Image {image_id} arrived corrupted: its {algo} "
                                      f"{got} is not Glance's os_hash_value {expected}; "
                                      "nothing was programmed.")
        if self.content_md5 and self._md5 is not None:
            md5 = self._md5
            if self.content_md5.lower() not in (
                    md5.hexdigest(), base64.b64encode(md5.digest()).decode().lower()):
                raise ImageError(502, f"Image {image_id} arrived corrupted: its checksum "
                                      f"{md5.hexdigest()} is not Glance's Content-MD5 "
                                      f"{self.content_md5}; nothing was programmed.")


class NoSource:
    """Neither Glance nor a directory is configured: say so, for every request."""

    MESSAGE = ("This node has no image source: set [agent] bitstream_dir, or configure "
               "[glance] (auth_type, and endpoint_override without a service catalog).")

    @contextlib.contextmanager
    def open(self, image_id: str) -> Iterator[str]:
        raise ImageError(400, self.MESSAGE)
        yield ""  # pragma: no cover - makes this a generator

    def find_by_function(self, function_id: str) -> str:
        raise ImageError(400, self.MESSAGE)


def from_config(conf: cfg.ConfigOpts) -> ImageSource:
    if conf.agent.bitstream_dir:
        return DirectorySource(conf.agent.bitstream_dir)
    if conf.glance.auth_type:
        return GlanceSource(conf, timeout=float(conf.conductor.program_timeout))
    return NoSource()
