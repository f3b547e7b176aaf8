"""Upstream Cyborg's schema revisions acceld knows: the ones ``acceld db import-cyborg``
reads (acceld.db.cyborg_import) and, with the older ones, those ``acceld db upgrade``
refuses to migrate (acceld.db.migrate: an upstream database is never acceld's)."""

from __future__ import annotations

# Upstream schema revisions the import reads: Cyborg 17's head, b47c8f2d1e3a
# (devices.device_state), as openstack-cyborg 17.0.0 creates it. A later release's new
# revision is refused by name until the import has been checked against its schema.
SUPPORTED = {"b47c8f2d1e3a": "Cyborg 17"}
# Older upstream revisions, newest first: a database at one of them is upgraded with
# upstream's own `cyborg-dbsync upgrade` before it is imported.
OLDER = ("a35b4295a0e5", "9625668549b5", "6c77bd6afea5", "4cc1d79978fc", "899cead40bc9",
         "7e6f1f107f2b", "60d8ac91fd20", "7a4fd0fc3f8c", "62bcf2610c5d", "7b696fd94949",
         "22fb1af2d51e", "57539722e5cf", "c1b5abada09c", "589ff20545b7", "ede4e3f1a232",
         "d6f033d8fa5b", "f50980397351")
