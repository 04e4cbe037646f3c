"""``statectl.toml``: the one reader of statectl's configuration file.

Read from the working directory (or ``$STATECTL_CONFIG``). Sections:

* ``[savepoint] dir = "..."``: the default savepoint target.
* ``[storage."PREFIX"]``: fsspec storage options for every URL under PREFIX, e.g.
  ``[storage."s3://lake/"]`` with ``endpoint_url``, ``key``, ``secret``, ``anon`` ...
"""

from __future__ import annotations

import os
import sys
from typing import Any

from statectl.errors import StatectlError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 only
    import tomli as tomllib

CONFIG_FILE = "statectl.toml"
ENV_CONFIG = "STATECTL_CONFIG"


def config_path() -> str:
    return os.environ.get(ENV_CONFIG) or CONFIG_FILE


def load_config() -> dict[str, Any]:
    """The parsed configuration file, or {} when there is none."""
    path = config_path()
    if not os.path.exists(path):
        if os.environ.get(ENV_CONFIG):
            raise StatectlError(f"no such file (named by ${ENV_CONFIG})", path)
        return {}
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise StatectlError(f"is not valid TOML ({e})", path) from None


def storage_sections() -> dict[str, dict[str, Any]]:
    """``[storage."PREFIX"]`` tables of the configuration file, by prefix."""
    storage = load_config().get("storage", {})
    if not isinstance(storage, dict) or not all(isinstance(v, dict) for v in storage.values()):
        raise StatectlError(
            'the [storage] section wants one table per URL prefix, like [storage."s3://lake/"]',
            config_path(),
        )
    return storage
