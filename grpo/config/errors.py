"""The one error a config raises: every check, in every section and across them, names the key
in one line. A leaf, so that each section's module can raise it without importing the checks."""


class ConfigError(ValueError):
    """A config file or override that cannot be used; the message names the key."""
