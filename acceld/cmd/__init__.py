"""The command line: ``acceld`` (main.py, with one module per subcommand family) and
``acceld-status`` (status.py, with its checks in the *_check.py modules beside it)."""
