"""Errors that reach users as one readable line."""


class FedhetError(Exception):
    """Base class: the command line prints ``str(error)`` and exits non-zero, no traceback."""


class ConfigError(FedhetError):
    """An invalid configuration key or value; the message names the key."""


class DataError(FedhetError):
    """A missing, corrupt or inconsistent data file; the message names the file."""


DATABASE_ERRORS = ("OperationalError", "InterfaceError", "DatabaseError", "StorageInternalError")
DATABASE_MODULES = ("sqlalchemy", "psycopg", "psycopg2", "pymysql", "MySQLdb", "sqlite3", "optuna")


def database_lost(exc: BaseException) -> str | None:
    """One line for a study database that stopped answering while a command used it (a
    server stopped or a connection cut mid-bench: the driver's, SQLAlchemy's or Optuna's
    error, anywhere in the exception's chain); None for any other exception."""
    seen: BaseException | None = exc
    while seen is not None:
        kind = type(seen)
        if kind.__name__ in DATABASE_ERRORS and kind.__module__.split(".")[0] in DATABASE_MODULES:
            reason = (str(getattr(seen, "orig", None) or seen).strip().splitlines() or [kind.__name__])[0]
            return f"the study database stopped answering ({reason})"
        seen = seen.__cause__ or seen.__context__
    return None


def read_user_text(path, what: str) -> str:
    """The UTF-8 text of a file a configuration names (``what``: its kind and key, e.g.
    "availability trace (system.availability_trace)"); a missing or unreadable file is one
    :class:`DataError` line naming it."""
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: {what} not found")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read ({exc})") from None


def read_fedscale_dict(path, what: str) -> dict:
    """A FedScale pickle that must hold a non-empty dict of clients (``what``: the kind of
    file, for the one-line error: "trace", "device-capacity file")."""
    import pickle
    from pathlib import Path

    path = Path(path)
    try:
        with path.open("rb") as fh:
            data = pickle.load(fh)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except Exception as exc:  # any unpickling failure: not such a file
        raise DataError(f"{path}: not a pickled FedScale {what} ({type(exc).__name__})") from None
    if not isinstance(data, dict) or not data:
        raise DataError(f"{path}: not a FedScale {what} (a dict of clients)")
    return data
