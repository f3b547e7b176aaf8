"""``[database]``: where acceld's database is and how each process pools its connections."""

from __future__ import annotations

from oslo_config import cfg

database_group = cfg.OptGroup("database", title="The database")

database_opts = [
    cfg.StrOpt("connection", secret=True,
               help="SQLAlchemy URL. Unset: sqlite:///<state_path>/acceld.sqlite. "
                    "PostgreSQL: postgresql+psycopg://user:pw@host/acceld; "
                    "MariaDB/MySQL: mysql+pymysql://user:pw@host/acceld."),
    cfg.IntOpt("sqlite_busy_timeout", default=30000, min=0,
               help="Milliseconds a SQLite writer waits for the write lock."),
    cfg.IntOpt("pool_size", default=5, min=1, deprecated_name="max_pool_size",
               help="Connections kept per process (server databases)."),
    cfg.IntOpt("max_overflow", default=10, min=0, help="Extra connections allowed beyond pool_size."),
    cfg.BoolOpt("echo", default=False, help="Log every SQL statement (debugging)."),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(database_opts, group=database_group.name)


def list_opts() -> dict[cfg.OptGroup, list[cfg.Opt]]:
    return {database_group: database_opts}
