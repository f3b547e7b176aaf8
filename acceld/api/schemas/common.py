"""Schema fragments shared across resources."""

UUID_PATTERN = r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}\Z"

uuid = {"type": "string", "pattern": UUID_PATTERN}
