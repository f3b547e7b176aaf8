"""The serving layer: how acceld's own servers read requests and send answers.

``connection_loop`` (a few threads on one epoll), ``request_framing`` (how much of a
request to wait for), ``serving_slot`` (one thread at a time runs the application in the
public API's workers), ``api_worker`` (the gunicorn worker of the public API) and
``pool_server`` (the internal servers' HTTP/1.1 server on the loop).
"""
