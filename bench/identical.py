"""Byte-identity check for performance work (issue 27): outputs before and after a change.

    python bench/identical.py record /tmp/before.json      # on the old code
    python bench/identical.py record /tmp/after.json       # on the new code
    python bench/identical.py compare /tmp/before.json /tmp/after.json

For ~25 fixtures of both backends (aggregation, dedup, join, session, flatMapGroupsWithState,
transformWithState, changelog, checkpoint format v2, codecs, row checksums) it runs
``statectl savepoint``, ``statectl restore`` of that savepoint and ``statectl migrate`` to the
other backend at 3 partitions (RocksDB-only kinds: RocksDB at 3), under the default budget
and under a small ``--memory`` (the streamed and chunked writers), and ``statectl export``,
then hashes every file written.

What differs between two runs of the same code, and is therefore normalized away: UUIDs (file
names, metadata JSON), the savepoint's random name suffix, ISO timestamps and ``timestampMs``,
zip member timestamps (members are hashed by name and content), and the random session
identity in each SST's properties (the runner makes it constant: ``random.choices`` of
``statectl.backends.sst`` patched in the CLI process and its forked workers).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "checkpoints"
CASES = [
    "agg-hdfs",
    "agg-rocksdb",
    "agg-rocksdb-changelog",
    "agg-ckptv2-rocksdb",
    "agg-ckptv2-rocksdb-changelog",
    "agg-types-hdfs",
    "agg-types-rocksdb",
    "agg-zstd-hdfs",
    "agg-lzf-hdfs",
    "agg-rowchecksum-hdfs",
    "agg-rowchecksum-rocksdb-changelog",
    "agg-snapshots-hdfs",
    "agg-snapshots-rocksdb-changelog",
    "agg-v1-rocksdb",
    "dedup-hdfs",
    "dedup-rocksdb-changelog",
    "dedupwm-rocksdb",
    "join-hdfs",
    "join-rocksdb-changelog",
    "join4-rocksdb",
    "fmgws-hdfs",
    "session-rocksdb-changelog",
    "window-hdfs",
    "multi-hdfs",
    "tws-rocksdb",
    "tws-avro-rocksdb-changelog",
    "spark35-agg-rocksdb",
]
ROCKSDB_ONLY = ("tws", "join4")
SMALL = "16M"
_UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_SP_NAME = re.compile(rb"savepoint-[0-9a-z]{1,6}-\d+-[0-9a-f]{8}")
_ISO = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?")
_TS = re.compile(rb'"timestampMs":\d+')
_SHA = re.compile(rb'"metadata_sha256": ?"[0-9a-f]{64}"')
_STRINGS = re.compile(rb"[ -~]{6,}")
_WORK: list[bytes] = []  # the current case's work directory (absolute paths in outputs)
_RUNNER = """
import random, sys
import statectl.backends.sst as sst
class _Fixed(random.Random):
    def choices(self, population, *a, k=1, **kw):
        return [population[0]] * k
sst.random = _Fixed(0)
from statectl.cli import main
sys.argv = ["statectl", *sys.argv[1:]]
main()
"""


def _norm(data: bytes) -> bytes:
    for pattern, repl in ((_UUID, b"UUID"), (_SP_NAME, b"SAVEPOINT"), (_ISO, b"TIME")):
        data = pattern.sub(repl, data)
    for work in _WORK:
        data = data.replace(work, b"WORK")
    data = _SHA.sub(b'"metadata_sha256":"SHA"', data)
    return _TS.sub(b'"timestampMs":0', data)


def _member(name: str, data: bytes) -> bytes:
    """A zip member's normalized bytes. ``MANIFEST-*`` is RocksDB's own (its random DB id,
    file creation times and the CRCs over them): its length and its strings."""
    if name.startswith("MANIFEST-"):
        return str(len(data)).encode() + b"|" + b"|".join(_STRINGS.findall(_norm(data)))
    return _norm(data)


def _digest(path: Path) -> str:
    data = path.read_bytes()
    if path.suffix == ".zip":
        h = hashlib.sha256()
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            for info in z.infolist():
                h.update(
                    _norm(info.filename.encode())
                    + b"\0"
                    + _member(info.filename, z.read(info))
                    + b"\0"
                )
        return h.hexdigest()
    return hashlib.sha256(_norm(data)).hexdigest()


def tree_digests(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            out[_norm(str(p.relative_to(root)).encode()).decode()] = _digest(p)
    return out


def statectl(*args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, "-c", _RUNNER, *args], env=env, capture_output=True, text=True
    )
    if res.returncode != 0:
        raise RuntimeError(f"statectl {' '.join(args)}: {res.stderr.strip()[-400:]}")


def record_case(name: str, work: Path) -> dict[str, dict[str, str]]:
    src = FIXTURES / name
    _WORK[:] = [str(work).encode(), str(FIXTURES).encode()]
    other = "rocksdb" if name.endswith("hdfs") or name.startswith(ROCKSDB_ONLY) else "hdfs"
    out: dict[str, dict[str, str]] = {}
    sp_dir = work / "sp"
    statectl("savepoint", str(src), str(sp_dir))
    (sp,) = sp_dir.iterdir()
    out["savepoint"] = tree_digests(sp_dir)
    for label, mem in (("", []), (f"-mem{SMALL}", ["--memory", SMALL])):
        statectl(
            "restore", str(work / f"r{label}"), "-s", str(sp), "--backend", other,
            "--partitions", "3", *mem,
        )  # fmt: skip
        out[f"restore{label}"] = tree_digests(work / f"r{label}")
        statectl(
            "migrate", str(src), str(work / f"m{label}"), "--backend", other,
            "--partitions", "3", *mem,
        )  # fmt: skip
        out[f"migrate{label}"] = tree_digests(work / f"m{label}")
    try:
        statectl("export", str(src), "--operator", "0", "-o", str(work / "e.parquet"))
        out["export"] = (
            tree_digests(work / "e.parquet")
            if (work / "e.parquet").is_dir()
            else {"e.parquet": _digest(work / "e.parquet")}
        )
    except RuntimeError as e:  # some kinds need --join-side / --state-var
        out["export"] = {"error": _norm(str(e).encode()).decode(errors="replace")}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("out")
    rec.add_argument("--only", nargs="*")
    tree = sub.add_parser("tree", help="digests of one directory's files, as JSON")
    tree.add_argument("dir")
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("a")
    cmp_.add_argument("b")
    args = ap.parse_args()
    if args.cmd == "tree":
        print(json.dumps(tree_digests(Path(args.dir)), sort_keys=True))
        return
    if args.cmd == "compare":
        a, b = (json.loads(Path(p).read_text()) for p in (args.a, args.b))
        bad = 0
        for case in sorted(set(a) | set(b)):
            for what in sorted(set(a.get(case, {})) | set(b.get(case, {}))):
                x, y = a.get(case, {}).get(what), b.get(case, {}).get(what)
                if x != y:
                    bad += 1
                    files = sorted(
                        k
                        for k in set(x or {}) | set(y or {})
                        if (x or {}).get(k) != (y or {}).get(k)
                    )
                    print(f"DIFF {case} {what}: {files[:6]}")
        n = sum(len(v) for v in a.values())
        print(f"{n} outputs compared, {bad} differ")
        sys.exit(1 if bad else 0)
    result = {}
    for name in args.only or CASES:
        work = Path(tempfile.mkdtemp(prefix="ident-"))
        try:
            try:
                result[name] = record_case(name, work)
            except RuntimeError as e:  # recorded: the other run must fail the same way
                err = _norm(str(e).encode()).decode(errors="replace")
                result[name] = {"error": {"error": err}}
            print(f"{name}: {sum(len(v) for v in result[name].values())} files", file=sys.stderr)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
