"""The CLI's glibc malloc settings (statectl/native_memory.py) are accepted by glibc."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_every_setting_is_accepted_by_glibc() -> None:
    # In a child process: the settings are process-wide, and the test process keeps glibc's
    # defaults. mallopt returns 0 for a value it rejects (e.g. an mmap threshold over 32 MiB).
    code = (
        "from statectl.native_memory import tune_for_bulk_work as t;"
        "import numpy as np;"
        "ok = t();"
        # a partition-sized array is allocated, freed and allocated again under the settings
        "[np.ones(4 << 20).sum() for _ in range(3)];"
        "print(ok)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_statectl_malloc_default_keeps_glibcs_settings(monkeypatch) -> None:
    from statectl.native_memory import tune_for_bulk_work

    monkeypatch.setenv("STATECTL_MALLOC", "default")
    assert tune_for_bulk_work() is False  # returns before any mallopt call
