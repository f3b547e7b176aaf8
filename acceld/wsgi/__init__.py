"""WSGI entry points for servers the operator runs (uwsgi, mod_wsgi, gunicorn)."""
