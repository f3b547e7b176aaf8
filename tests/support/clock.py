"""A conductor whose clock is off: this process's time source, skewed for a test.

acceld stamps rows and, where it still does, judges "now" with
``acceld.db.models.utcnow``, which reads ``models.dt.datetime.now``. Replacing that
one name skews every caller (functions that captured ``utcnow`` as a default
too), while the database server's clock stays right: what a conductor on a
host with a drifting clock sees.
"""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

from acceld.db import models

MINUTES_10 = dt.timedelta(minutes=10)


def skew(monkeypatch, offset: dt.timedelta) -> None:  # type: ignore[no-untyped-def]
    """From now until the test ends, this process's clock runs ``offset`` off."""
    real = dt.datetime

    class Skewed(real):  # type: ignore[valid-type, misc]
        @classmethod
        def now(cls, tz=None):  # type: ignore[no-untyped-def, override]
            return real.now(tz) + offset

    monkeypatch.setattr(models, "dt", SimpleNamespace(
        datetime=Skewed, timezone=dt.timezone, timedelta=dt.timedelta))
