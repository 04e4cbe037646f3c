"""bench/treemem.py: the peak memory of a whole process tree, on real processes."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    "statectl_bench_treemem", ROOT / "bench" / "treemem.py"
)
assert _spec and _spec.loader
treemem = importlib.util.module_from_spec(_spec)
sys.modules["statectl_bench_treemem"] = treemem
_spec.loader.exec_module(treemem)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

MB = 1 << 20
CHILD_MB = 50

# A parent that holds nothing big and forks two children; each child allocates CHILD_MB of
# distinct pages (written, so resident) after the fork, then both hold them until the parent
# has seen both ready and waited long enough for several samples.
TWO_CHILDREN = textwrap.dedent(
    f"""
    import os, time
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    kids = []
    for i in range(2):
        pid = os.fork()
        if pid == 0:
            os.close(go_w)
            block = bytearray({CHILD_MB} * 2**20)
            block[::4096] = b"x" * len(range(0, len(block), 4096))  # touch every page
            os.write(ready_w, b"r")
            os.read(go_r, 1)  # held until the parent closes go_w
            os._exit(0)
        kids.append(pid)
    os.close(go_r)
    for _ in kids:
        os.read(ready_r, 1)
    time.sleep(1.0)  # long enough for 10 samples on a loaded machine (the sampler backs off)
    os.close(go_w)
    for pid in kids:
        os.waitpid(pid, 0)
    """
)


def test_tree_peak_sums_concurrent_children() -> None:
    out = treemem.run([sys.executable, "-c", TWO_CHILDREN], interval=0.02)
    assert out.returncode == 0
    assert out.processes == 3
    assert out.samples >= 10
    # One child: its CHILD_MB plus the interpreter; the tree: both children and the parent.
    assert CHILD_MB * MB <= out.single_rss < (CHILD_MB + 40) * MB
    assert out.tree_rss >= 2 * CHILD_MB * MB + out.single_rss - CHILD_MB * MB
    assert out.tree_rss > out.single_rss + 40 * MB
    # PSS counts the children's own pages once each and splits the interpreter's shared pages.
    assert out.tree_pss is not None
    assert 2 * CHILD_MB * MB <= out.tree_pss < out.tree_rss
    assert out.lingering == []
    # The peak's make-up: the three processes, whose RSS add up to it.
    assert len(out.at_peak) == 3
    assert sum(rss for _, _, rss, _ in out.at_peak) == out.tree_rss
    # Of the samples-1 gaps between samples, the one before the sample at CMD's exit is not
    # waited (it catches the orphans at once): the mean is over samples, so it may fall below 0.02
    # by up to two intervals over ~25 (seen: 0.0195).
    assert out.sample_every >= 0.02 * (out.samples - 2) / out.samples


def test_pages_shared_after_fork_count_once_in_pss() -> None:
    # The parent touches CHILD_MB before forking two idle children: RSS sees the block three
    # times, PSS once.
    script = textwrap.dedent(
        f"""
        import os, time
        block = bytearray({CHILD_MB} * 2**20)
        block[::4096] = b"x" * len(range(0, len(block), 4096))
        kids = []
        for _ in range(2):
            pid = os.fork()
            if pid == 0:
                time.sleep(0.4)
                os._exit(0)
            kids.append(pid)
        for pid in kids:
            os.waitpid(pid, 0)
        """
    )
    out = treemem.run([sys.executable, "-c", script], interval=0.02)
    assert out.returncode == 0
    assert out.tree_rss >= 3 * CHILD_MB * MB
    assert out.tree_pss is not None
    assert CHILD_MB * MB <= out.tree_pss < 2 * CHILD_MB * MB


def test_a_process_sharing_its_parents_address_space_counts_once() -> None:
    # clone(CLONE_VM) without CLONE_THREAD, as vfork and posix_spawn create (a JVM starting a
    # command): the child runs libc's sleep(1) on its own stack in the parent's address space,
    # and /proc reports the parent's RSS and PSS for it too.
    script = textwrap.dedent(
        f"""
        import ctypes, os, signal
        block = bytearray({CHILD_MB} * 2**20)
        block[::4096] = b"x" * len(range(0, len(block), 4096))
        libc = ctypes.CDLL(None, use_errno=True)
        stack = ctypes.create_string_buffer(1 << 16)
        top = ctypes.c_void_p(ctypes.addressof(stack) + (1 << 16) - 64)
        CLONE_VM = 0x100
        sleep = ctypes.cast(libc.sleep, ctypes.c_void_p)
        pid = libc.clone(sleep, top, CLONE_VM | signal.SIGCHLD, ctypes.c_void_p(1))
        assert pid > 0, ctypes.get_errno()
        os.waitpid(pid, 0)
        """
    )
    out = treemem.run([sys.executable, "-c", script], interval=0.02)
    assert out.returncode == 0
    assert out.processes == 2
    assert CHILD_MB * MB <= out.tree_rss < (CHILD_MB + 40) * MB
    assert out.tree_pss is not None and out.tree_pss < (CHILD_MB + 40) * MB


def test_orphans_stay_in_the_tree_and_are_reaped(tmp_path: Path) -> None:
    # CMD forks a child that allocates, then exits at once: the orphan is reparented to the
    # sampler (a child subreaper), still counted, followed until it exits, and reaped.
    pid_file = tmp_path / "orphan.pid"
    script = textwrap.dedent(
        f"""
        import os, time
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            block = bytearray({CHILD_MB} * 2**20)
            block[::4096] = b"x" * len(range(0, len(block), 4096))
            os.write(w, b"r")
            time.sleep(0.5)
            os._exit(0)
        os.read(r, 1)
        open({str(pid_file)!r}, "w").write(str(pid))
        """
    )
    out = treemem.run([sys.executable, "-c", script], interval=0.02)
    assert out.returncode == 0
    assert out.seconds < 0.5 + 0.3  # CMD's own time, not the orphan's
    assert out.single_rss >= CHILD_MB * MB
    assert out.lingering == []
    orphan = int(pid_file.read_text())
    assert not Path(f"/proc/{orphan}").exists()  # reaped, not left a zombie
    assert treemem._set_subreaper(0) == 0  # the setting was restored


def test_churn_and_exit_code() -> None:
    # Many short-lived children appear and vanish between and during samples.
    script = textwrap.dedent(
        """
        import os, sys
        for _ in range(200):
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
        sys.exit(3)
        """
    )
    out = treemem.run([sys.executable, "-c", script], interval=0.001)
    assert out.returncode == 3
    assert out.samples >= 1
    assert out.tree_rss > 0


def test_cli_prints_json_with_the_waited_for_maximum() -> None:
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "treemem.py"),
            "--devnull",
            "--",
            sys.executable,
            "-c",
            TWO_CHILDREN + "\nprint('noise')\n",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ},
    )
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert "noise" not in res.stdout
    # ru_maxrss is the single largest process, exact; the sampled single peak is close to it.
    assert out["max_rss_waited"] >= CHILD_MB * MB
    assert abs(out["single_rss"] - out["max_rss_waited"]) < 10 * MB
    assert out["tree_rss"] > out["max_rss_waited"] + 40 * MB
