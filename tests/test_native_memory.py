"""The CLI's glibc malloc settings (statectl/native_memory.py) are accepted by glibc."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _in_child(code: str, env: dict[str, str] | None = None) -> str:
    """What ``code`` prints, run in a child process: the settings are process-wide, and the
    test process keeps glibc's defaults."""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    return out.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_every_setting_is_accepted_by_glibc() -> None:
    # mallopt returns 0 for a value it rejects (e.g. an mmap threshold over 32 MiB).
    code = (
        "from statectl.native_memory import tune_for_bulk_work as t;"
        "import numpy as np;"
        "ok = t();"
        # a partition-sized array is allocated, freed and allocated again under the settings
        "[np.ones(4 << 20).sum() for _ in range(3)];"
        "print(ok)"
    )
    assert _in_child(code) == "True"


def test_statectl_malloc_default_keeps_glibcs_settings(monkeypatch) -> None:
    from statectl.native_memory import tune_for_bulk_work

    monkeypatch.setenv("STATECTL_MALLOC", "default")
    assert tune_for_bulk_work() is False  # returns before any mallopt call


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.parametrize(("preset", "backend"), [(None, "system"), ("mimalloc", "mimalloc")])
def test_arrow_allocates_from_the_same_malloc_unless_the_user_chose(preset, backend) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if preset:
        env["ARROW_DEFAULT_MEMORY_POOL"] = preset
    for code in (
        # the CLI's order: settings first, pyarrow imported later
        "from statectl.native_memory import tune_for_bulk_work as t; t();"
        "import pyarrow as pa; print(pa.default_memory_pool().backend_name)",
        # pyarrow already imported (the Python API's process, a test)
        "import pyarrow as pa; from statectl.native_memory import tune_for_bulk_work as t; t();"
        "print(pa.default_memory_pool().backend_name)",
    ):
        assert _in_child(code, env) == backend


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_free_heap_memory_goes_back_only_above_the_limit() -> None:
    # Under the CLI's settings, freed blocks stay with the process until its RSS is over the
    # limit it is given.
    assert (
        _in_child(
            "from statectl.native_memory import tune_for_bulk_work as t, release_above as r;"
            "import numpy as np;"
            "t();"
            "rss = lambda: int(open('/proc/self/statm').read().split()[1]) * 4096;"
            # 8 MiB blocks come from the heap under the settings (the mmap threshold is 32 MiB)
            "blocks = [np.ones(1 << 20) for _ in range(40)];"
            "held = rss(); del blocks;"
            "kept = rss();"
            "assert not r(held * 10) and rss() >= kept - (4 << 20), 'trimmed below the limit';"
            "assert r(0) and rss() < kept - (200 << 20), (kept, rss());"
            "print('ok')"
        )
        == "ok"
    )
