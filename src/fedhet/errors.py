"""Errors that reach users as one readable line."""


class FedhetError(Exception):
    """Base class: the command line prints ``str(error)`` and exits non-zero, no traceback."""


class ConfigError(FedhetError):
    """An invalid configuration key or value; the message names the key."""


class DataError(FedhetError):
    """A missing, corrupt or inconsistent data file; the message names the file."""
