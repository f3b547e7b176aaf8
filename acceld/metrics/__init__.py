"""Prometheus metrics of acceld's services (docs/observability.md).

- :mod:`families`: every metric family, and which service exposes which;
- :mod:`inventory`: the inventory gauges, read from the database at scrape time;
- :mod:`record`: the one-line calls the services' code makes to count what they do;
- :mod:`http`: the listener that serves ``/metrics`` on its own address;
- :mod:`multiproc`: prometheus-client's multiprocess mode for the API's workers;
- :mod:`serve`: starting all of it for one service, from ``[metrics]``.

Counting happens whether or not a service serves its metrics (a lock and an add per
event, cheaper than deciding each time); ``[metrics] <service>_enabled`` decides
whether anything listens, and for the API whether requests are counted at all.
"""
