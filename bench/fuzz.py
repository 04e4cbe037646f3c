"""Adversarial campaign: run the real CLI on corrupted copies of the bundled fixtures.

    python bench/fuzz.py --n 3000 --jobs 2            # the issue-8 campaign, prints a table
    python bench/fuzz.py --n 200 --families tws,savepoint --seed 7
    python bench/fuzz.py --seed 1 --case 42 --keep    # re-run one case, keep its directory

Each case copies one fixture (or a savepoint of one) into a private directory, applies one
mutation, then runs ``statectl.cli.main()`` in a forked child (the parent has imported
everything, so a command costs its work, not an interpreter start) for every command of the
fixture: ``inspect --json``, ``export`` of every selection in fixtures/manifest.json, ``savepoint``
and ``export`` from that savepoint (crafted savepoints: ``inspect``, ``export``, ``restore`` and
``export`` from the restored checkpoint). Each command is classified against the same command on
the uncorrupted copy:

    same          exit 0, output identical to the baseline
    clean-error   exit 2, only ``statectl: error: ...`` lines on stderr, no traceback
    SILENT-DIFF   exit 0, different rows / different output
    TRACEBACK     an exception escaped main()
    HANG          the case exceeded --timeout
    CRASH         killed by a signal, or an exit code other than 0 and 2
    ESCAPE        a file outside the case's out/ and tmp/ was created, modified or deleted
                  (the source copy included), or a file in the sentinel directory was opened

A case's outcome is its worst command. Traversal payloads point into ``<case>/sentinel``; an
audit hook (``sys.addaudithook``) records every open of a sentinel file and every write outside
``out/`` and ``tmp/``, and the case directory is snapshotted (sha256 of every file) before and
after. Failing cases go to a JSON-lines reproducer file (``--failures``), each with the mutation
and the command; ``--seed S --case I`` replays one.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import hashlib
import io
import json
import os
import posixpath
import random
import resource
import shutil
import signal
import sys
import tempfile
import time
import traceback
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import fuzz_trust  # noqa: E402

FIXTURES = REPO / "fixtures" / "checkpoints"
MANIFEST = REPO / "fixtures" / "manifest.json"

FAMILIES: dict[str, list[str]] = {
    "hdfs": [
        "agg-hdfs",
        "dedup-hdfs",
        "dedupwm-hdfs",
        "fmgws-hdfs",
        "join-hdfs",
        "multi-hdfs",
        "window-hdfs",
        "agg-types-hdfs",
        "agg-snapshots-hdfs",
        "agg-rowchecksum-hdfs",
        "agg-uncommitted-hdfs",
        "spark35-agg-hdfs",
        "spark35-join-hdfs",
    ],
    "rocksdb-zip": [
        "agg-rocksdb",
        "dedup-rocksdb",
        "dedupwm-rocksdb",
        "fmgws-rocksdb",
        "join-rocksdb",
        "window-rocksdb",
        "agg-types-rocksdb",
        "spark35-agg-rocksdb",
    ],
    "rocksdb-changelog": [
        "agg-rocksdb-changelog",
        "dedup-rocksdb-changelog",
        "dedupwm-rocksdb-changelog",
        "fmgws-rocksdb-changelog",
        "join-rocksdb-changelog",
        "window-rocksdb-changelog",
        "agg-snapshots-rocksdb-changelog",
        "agg-rowchecksum-rocksdb-changelog",
    ],
    "ckptv2": ["agg-ckptv2-rocksdb", "agg-ckptv2-rocksdb-changelog"],
    "tws": [
        "tws-rocksdb",
        "tws-rocksdb-changelog",
        "tws-avro-rocksdb",
        "tws-mergev1-rocksdb",
        "tws-mergev1-rocksdb-changelog",
    ],
    "codec": ["agg-lzf-hdfs", "agg-snappy-hdfs", "agg-zstd-hdfs", "agg-hdfs"],
    # Crafted canonical savepoints (of a fixture of any family above) fed to export and restore.
    "savepoint": ["agg-hdfs", "join-rocksdb", "tws-rocksdb", "agg-ckptv2-rocksdb", "multi-hdfs"],
    # A writing command (savepoint, restore, migrate) killed with SIGKILL at a random moment,
    # then its output read back and the command re-run (see "kill -9" below).
    "kill": [
        "agg-hdfs",
        "join-rocksdb",
        "tws-rocksdb",
        "agg-ckptv2-rocksdb",
        "agg-rocksdb-changelog",
        "multi-hdfs",
    ],
    # `dispose` of a savepoint with user files, nested checkpoints, crafted paths, missing
    # files, and the path given through a link, `..`, `.` or a trailing slash (see "dispose").
    "dispose": ["agg-hdfs", "join-rocksdb", "tws-rocksdb", "multi-hdfs"],
    # Issue 26 (bench/fuzz_trust.py): checkpoints without checksum files, FIFOs and links in
    # place of files, forged Parquet under a re-sealed _metadata, self-contradicting savepoints.
    "nocrc": [
        "agg-hdfs",
        "dedup-hdfs",
        "join-hdfs",
        "window-hdfs",
        "agg-snappy-hdfs",
        "agg-rocksdb",
        "agg-rocksdb-changelog",
        "dedupwm-rocksdb-changelog",
        "tws-rocksdb-changelog",
        "agg-ckptv2-rocksdb-changelog",
    ],
    "fsnodes": ["agg-hdfs", "agg-rocksdb-changelog", "tws-rocksdb", "agg-ckptv2-rocksdb"],
    "sp-fsnodes": ["agg-hdfs", "join-rocksdb", "tws-rocksdb"],
    "sp-forged": ["agg-hdfs", "join-rocksdb", "tws-rocksdb", "agg-types-hdfs", "multi-hdfs"],
    "sp-inconsistent": ["agg-hdfs", "join-rocksdb", "tws-rocksdb", "multi-hdfs"],
}

CKPT_CLASSES = [
    "flip",
    "truncate",
    "zero",
    "delete",
    "swap-partition",
    "swap-version",
    "json-type",
    "json-garbage",
    "deep-json",
    "non-utf8",
    "schema",
    "zip-member",
]
SP_CLASSES = [
    "sp-abs-path",
    "sp-dotdot-path",
    "sp-symlink",
    "sp-drop-file",
    "sp-sha256",
    "sp-rows",
    "sp-bytes",
    "sp-operator-id",
    "sp-huge-batch",
    "sp-json-type",
    "sp-flip",
    "sp-truncate",
]
# cases that need a savepoint of the fixture
SP_FAMILIES = ("savepoint", "kill", "dispose", "sp-fsnodes", "sp-forged", "sp-inconsistent")
# crafted savepoints, run with the savepoint family's commands (sp-fsnodes also lists)
SP_LIKE = ("savepoint", "sp-fsnodes", "sp-forged", "sp-inconsistent")
FS_FAMILIES = ("fsnodes", "sp-fsnodes")  # a command may block: each has its own timeout
COMMAND_TIMEOUT = 15.0  # seconds, in the FS families (a FIFO blocks an open forever)
FS_MEMORY = 3 << 30  # bytes of data segment per case child in the FS families
KILL_CLASSES = ["kill-savepoint", "kill-restore", "kill-migrate"]
DISPOSE_CLASSES = ["dispose", "dispose-force"]
# Savepoint mutations that model a crafted (re-sealed) _metadata rather than damage.
CRAFTED_SAVEPOINT = {
    "sp-abs-path",
    "sp-dotdot-path",
    "sp-symlink",
    "sp-drop-file",
    "sp-operator-id",
}
OUTCOMES = [
    "same",
    "clean-error",
    # nocrc: a different result, but inspect reported the checkpoint unverifiable, naming the
    # changed file (what a checkpoint without checksums can honestly give)
    "unverifiable",
    "SILENT-DIFF",
    "NO-RECOVERY",  # after kill -9, re-running the command (with --overwrite) did not recover
    "TRACEBACK",
    "HANG",
    "CRASH",
    "ESCAPE",
]
SEVERITY = {o: i for i, o in enumerate(OUTCOMES)}
SEVERITY["HANG"] = SEVERITY["SILENT-DIFF"] + 0.5  # worse than a diff, less than a traceback
BAD = {"SILENT-DIFF", "NO-RECOVERY", "TRACEBACK", "HANG", "CRASH", "ESCAPE"}

# Values of the wrong type (or hostile values of the right one) for JSON fields.
WRONG_VALUES: list[Any] = [
    None,
    -1,
    2**63,
    1.5,
    "x",
    "",
    [],
    {},
    [1, "a"],
    {"a": 1},
    True,
    "../../sentinel/pwned",
    "/etc/passwd",
]


def manifest() -> dict[str, dict[str, Any]]:
    return {f["name"]: f for f in json.loads(MANIFEST.read_text())["fixtures"]}


def selection_args(read: dict[str, Any]) -> list[str]:
    """CLI options of one statestore read of the manifest."""
    o = read["options"]
    args = ["--operator", str(read["operatorId"])]
    if "joinSide" in o:
        args += ["--join-side", o["joinSide"]]
    if "storeName" in o:
        args += ["--store", o["storeName"]]
    if "stateVarName" in o:
        args += ["--state-var", o["stateVarName"]]
    if o.get("readRegisteredTimers") == "true":
        args += ["--timers"]
    return args


# -- commands ----------------------------------------------------------------------------------


@dataclass
class Command:
    """One CLI invocation; ``{src}``, ``{out}`` are filled in per case. ``compare`` names what
    is compared with the baseline: the JSON on stdout (minus paths) and/or an output file."""

    name: str
    argv: list[str]
    output_file: str | None = None  # relative to out/
    needs: str | None = None  # a command whose success this one depends on
    # where it may write, as prefixes of paths relative to out/ (an output and its temporary
    # siblings); anywhere else, out/ included, is an ESCAPE
    writes: tuple[str, ...] = ()


def checkpoint_commands(fixture: str) -> list[Command]:
    reads = manifest()[fixture]["reads"]
    cmds = [Command("inspect", ["inspect", "{src}", "--json"])]
    for i, r in enumerate(reads):
        cmds.append(
            Command(
                f"export[{i}]",
                ["export", "{src}", *selection_args(r), "-o", f"{{out}}/e{i}.jsonl", "--json"],
                f"e{i}.jsonl",
                writes=(f"e{i}.jsonl", f".e{i}.jsonl."),
            )
        )
    cmds.append(
        Command("savepoint", ["savepoint", "{src}", "{out}/sp", "--json"], writes=("sp/", "sp"))
    )
    for i, r in enumerate(reads):
        cmds.append(
            Command(
                f"sp-export[{i}]",
                ["export", "{sp}", *selection_args(r), "-o", f"{{out}}/s{i}.jsonl", "--json"],
                f"s{i}.jsonl",
                needs="savepoint",
                writes=(f"s{i}.jsonl", f".s{i}.jsonl."),
            )
        )
    return cmds


def savepoint_commands(fixture: str) -> list[Command]:
    reads = manifest()[fixture]["reads"]
    cmds = [Command("inspect", ["inspect", "{src}", "--json"])]
    for i, r in enumerate(reads):
        cmds.append(
            Command(
                f"export[{i}]",
                ["export", "{src}", *selection_args(r), "-o", f"{{out}}/e{i}.jsonl", "--json"],
                f"e{i}.jsonl",
                writes=(f"e{i}.jsonl", f".e{i}.jsonl."),
            )
        )
    cmds.append(
        Command(
            "restore",
            ["restore", "{out}/restored", "-s", "{src}", "--json"],
            writes=("restored", ".restored"),
        )
    )
    for i, r in enumerate(reads):
        cmds.append(
            Command(
                f"restored-export[{i}]",
                [
                    "export",
                    "{out}/restored",
                    *selection_args(r),
                    "-o",
                    f"{{out}}/r{i}.jsonl",
                    "--json",
                ],
                f"r{i}.jsonl",
                needs="restore",
                writes=(f"r{i}.jsonl", f".r{i}.jsonl."),
            )
        )
    return cmds


# -- the case directory and its watchers -------------------------------------------------------


@dataclass
class CaseDirs:
    root: Path

    @property
    def src(self) -> Path:
        return self.root / "src"

    @property
    def out(self) -> Path:
        return self.root / "out"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def sentinel(self) -> Path:
        return self.root / "sentinel"

    def make(self) -> None:
        for d in (self.out, self.tmp, self.sentinel):
            d.mkdir(parents=True, exist_ok=True)
        (self.sentinel / "marker").write_text("a file statectl must never touch\n")


def snapshot(root: Path, skip: tuple[Path, ...]) -> dict[str, str]:
    """sha256 (or symlink target) of every file under root, skipping the allowed write dirs."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        dirnames[:] = [n for n in dirnames if d / n not in skip]
        for n in filenames + [n for n in dirnames if (d / n).is_symlink()]:
            p = d / n
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "->" + os.readlink(p)
            elif not p.is_file():  # a FIFO (fsnodes): opening it would block the harness
                out[rel] = "not a regular file"
            else:
                try:
                    out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
                except OSError as e:
                    out[rel] = f"unreadable {e}"
    return out


def diff_snapshots(a: dict[str, str], b: dict[str, str]) -> list[str]:
    changes = [f"created {k}" for k in b.keys() - a.keys()]
    changes += [f"deleted {k}" for k in a.keys() - b.keys()]
    changes += [f"modified {k}" for k in a.keys() & b.keys() if a[k] != b[k]]
    return sorted(changes)


class Watch:
    """An audit hook: opens of sentinel files, writes outside out/ and tmp/ (ESCAPE)."""

    def __init__(self, dirs: CaseDirs, log: Path | None = None) -> None:
        self.log = log  # events also appended here: a forked child's events outlive it
        self.sentinel = str(dirs.sentinel.resolve())
        self.out = str(dirs.out.resolve())
        self.tmp = str(dirs.tmp.resolve())
        self.writes: tuple[str, ...] = ()  # prefixes under out/ of the running command
        self.events: list[str] = []
        self.active = True

    def _inside(self, path: str, base: str) -> bool:
        return path == base or path.startswith(base + os.sep)

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.active:
            return
        if event == "open":
            path, mode, flags = ([*list(args), None, None, None])[:3]
            if isinstance(path, int) or path is None:
                return
            path = os.fsdecode(path)
            write = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int)
                and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC)
            )
            self._check(path, write, "open")
        elif event in ("os.remove", "os.rmdir", "os.mkdir", "shutil.rmtree", "os.truncate"):
            if args and not isinstance(args[0], int):
                path = os.fsdecode(args[0])
                dir_fd = args[-1] if event != "os.truncate" and len(args) > 1 else None
                if isinstance(dir_fd, int) and not os.path.isabs(path):
                    # rmtree works with dir_fd: resolve the name against that directory
                    with contextlib.suppress(OSError):
                        path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
                self._check(path, True, event)
        elif event in ("os.rename", "shutil.move", "shutil.copyfile", "os.symlink", "os.link"):
            if len(args) > 1 and not isinstance(args[1], int):
                self._check(os.fsdecode(args[1]), True, event)
            if event in ("os.rename", "shutil.move") and args and not isinstance(args[0], int):
                self._check(os.fsdecode(args[0]), True, event)

    def _check(self, path: str, write: bool, what: str) -> None:
        # realpath: a symlink inside the source that points at the sentinel is an escape too.
        real = os.path.realpath(os.path.abspath(path))
        if self._inside(real, self.sentinel):
            self._event(f"{what} {'write' if write else 'read'} {real}")
        elif what == "os.mkdir" and os.path.isdir(real):
            return  # makedirs(exist_ok=True) on an existing parent creates nothing
        elif write and not self._inside(real, self.tmp):
            if real.startswith("/dev/") or "__pycache__" in real:
                return
            rel = real[len(self.out) + 1 :] if self._inside(real, self.out) else None
            if rel is None or not any(rel.startswith(w) for w in self.writes):
                self._event(f"{what} write outside the command's output: {real}")

    def _event(self, text: str) -> None:
        self.events.append(text)
        if self.log is not None:
            self.active = False  # the log write is the harness's own
            try:
                with open(self.log, "a") as f:
                    f.write(text + "\n")
            finally:
                self.active = True

    def logged(self) -> list[str]:
        """Events logged by forked children (the ones not already in ``events``)."""
        if self.log is None or not self.log.is_file():
            return []
        return [e for e in self.log.read_text().splitlines() if e not in self.events]


# -- mutations ---------------------------------------------------------------------------------


def _files(src: Path) -> list[str]:
    return sorted(str(p.relative_to(src)) for p in src.rglob("*") if p.is_file())


def _is_state(rel: str) -> bool:
    return rel.startswith("state/") and "/_metadata/" not in rel and not _is_crc(rel)


def _is_crc(rel: str) -> bool:
    return rel.endswith(".crc")


def _is_json_text(rel: str) -> bool:
    parts = rel.split("/")
    name = parts[-1]
    if name.startswith("."):
        return False
    if parts[0] in ("offsets", "commits", "sources") or rel == "metadata":
        return True
    if "_metadata" in parts and (name == "metadata" or "v2" in parts):
        return True
    # checkpoint v2 / Spark 4.1+ checksum files are JSON
    return _is_crc(rel) and not name.startswith(".")


def _is_schema(rel: str) -> bool:
    parts = rel.split("/")
    if parts[-1].startswith("."):
        return False
    return "_stateSchema" in parts or (parts[-1] == "schema" and "_metadata" in parts)


def _weighted(rng: random.Random, files: list[str]) -> str:
    weights = [4 if _is_state(f) else (0.3 if _is_crc(f) else 1) for f in files]
    return rng.choices(files, weights)[0]


def _json_paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _json_paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _json_paths(v, (*prefix, i))
    return out


def _set_path(obj: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    cur = obj
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return obj


def _json_lines(data: bytes) -> list[int]:
    lines = data.decode("utf-8", "replace").split("\n")
    out = []
    for i, line in enumerate(lines):
        try:
            json.loads(line)
            out.append(i)
        except ValueError:
            pass
    return out


def _deep(rng: random.Random) -> str:
    depth = rng.choice([1000, 100_000])
    return "[" * depth + "]" * depth if rng.random() < 0.5 else '{"a":' * depth + "1" + "}" * depth


def _zips(files: list[str]) -> list[str]:
    return [f for f in files if f.endswith(".zip") and not f.split("/")[-1].startswith(".")]


def plan_mutation(rng: random.Random, cls: str, src: Path) -> dict[str, Any] | None:
    """A concrete, replayable mutation of class ``cls`` for the copy at ``src`` (None: n/a)."""
    files = _files(src)
    if cls in ("flip", "truncate", "zero", "delete"):
        rel = _weighted(rng, files)
        size = (src / rel).stat().st_size
        if cls == "delete":
            return {"cls": cls, "file": rel}
        if size == 0:
            return None
        if cls == "flip":
            return {
                "cls": cls,
                "file": rel,
                "flips": [
                    [rng.randrange(size), 1 << rng.randrange(8)] for _ in range(rng.randint(1, 3))
                ],
            }
        if cls == "truncate":
            return {"cls": cls, "file": rel, "size": rng.randrange(size)}
        off = rng.randrange(size)
        return {
            "cls": cls,
            "file": rel,
            "offset": off,
            "length": rng.randint(1, max(1, min(512, size - off))),
        }
    if cls == "swap-partition":
        cands = [f for f in files if _is_state(f) or (f.startswith("state/") and _is_crc(f))]
        rng.shuffle(cands)
        for rel in cands:
            parts = rel.split("/")
            if len(parts) > 3 and parts[2].isdigit():
                for p in range(4):
                    if str(p) != parts[2]:
                        other = "/".join([*parts[:2], str(p), *parts[3:]])
                        if (src / other).is_file():
                            return {"cls": cls, "file": rel, "other": other}
        return None
    if cls == "swap-version":
        cands = [f for f in files if _is_state(f)]
        rng.shuffle(cands)
        for rel in cands:
            d, name = rel.rsplit("/", 1)
            ext = name.split(".", 1)[-1] if "." in name else ""
            peers = [
                f
                for f in files
                if f.rsplit("/", 1)[0] == d
                and f != rel
                and f.endswith("." + ext)
                and not _is_crc(f)
            ]
            if peers:
                return {"cls": cls, "file": rel, "other": rng.choice(peers)}
        return None
    if cls in ("json-type", "json-garbage", "deep-json"):
        cands = [f for f in files if _is_json_text(f) and _json_lines((src / f).read_bytes())]
        zips = _zips(files)
        if zips and rng.random() < 0.3:
            z = rng.choice(zips)
            return {"cls": cls, "file": z, "member": "metadata", **_json_edit(rng, cls, z, src)}
        if not cands:
            return None
        rel = rng.choice(cands)
        return {"cls": cls, "file": rel, **_json_edit(rng, cls, rel, src)}
    if cls == "non-utf8":
        cands = [f for f in files if _is_json_text(f) or _is_schema(f)]
        if not cands:
            return None
        rel = rng.choice(cands)
        size = (src / rel).stat().st_size
        return {
            "cls": cls,
            "file": rel,
            "offset": rng.randrange(size + 1),
            "bytes": rng.choice(["ff", "c328", "eda080", "fffe00"]),
        }
    if cls == "schema":
        cands = [f for f in files if _is_schema(f)]
        if not cands:
            return None
        rel = rng.choice(cands)
        kind = rng.choice(["type", "garbage", "deep", "chunks", "utf"])
        return {"cls": cls, "file": rel, "kind": kind, "seed": rng.randrange(1 << 30)}
    if cls == "zip-member":
        zips = _zips(files)
        if not zips:
            return None
        kind = rng.choice(
            [
                "member-traversal",
                "local-traversal",
                "local-absolute",
                "dfs-traversal",
                "deflate-damage",
                "metadata-types",
            ]
        )
        return {"cls": cls, "file": rng.choice(zips), "kind": kind, "seed": rng.randrange(1 << 30)}
    raise ValueError(cls)


def _json_edit(rng: random.Random, cls: str, rel: str, src: Path) -> dict[str, Any]:
    if cls == "json-type":
        return {"value": rng.choice(WRONG_VALUES), "pick": rng.randrange(1 << 30)}
    if cls == "json-garbage":
        return {
            "text": rng.choice(
                ['{"a":', "}{", "nul", "[1,2", '{"id": 1}', "\x00\x01", "{}", "[]", "1e999999"]
            )
        }
    return {"depth": rng.choice([1000, 100_000]), "shape": rng.choice(["list", "dict"])}


def _edit_json_text(text: str, m: dict[str, Any]) -> str:
    """Apply a json-* mutation to one JSON line of a text file (chosen by ``pick``)."""
    lines = text.split("\n")
    idx = [i for i, line in enumerate(lines) if _is_json_line(line)]
    if not idx:
        idx = [len(lines) - 1]
    i = idx[m.get("pick", 0) % len(idx)]
    if "line" in m:
        i = m["line"]
    cls = m["cls"]
    if cls == "json-garbage":
        lines[i] = m["text"]
    elif cls == "deep-json":
        d = m["depth"]
        lines[i] = "[" * d + "]" * d if m["shape"] == "list" else '{"a":' * d + "1" + "}" * d
    elif "path" in m:  # an explicit field: the first JSON line that has it
        for i in idx:
            obj = json.loads(lines[i])
            with contextlib.suppress(KeyError, IndexError, TypeError):
                _set_path(obj, tuple(m["path"]), m["value"])
                lines[i] = json.dumps(obj)
                break
        else:
            raise ValueError(f"no JSON line has {m['path']}")
    else:
        obj = json.loads(lines[i])
        paths = _json_paths(obj)
        path = paths[m["pick"] % len(paths)]
        # Spark nests JSON in strings (operatorPropertiesJson, offsets): edit inside them too.
        obj = _set_path(obj, path, m["value"])
        lines[i] = json.dumps(obj)
    return "\n".join(lines)


def _is_json_line(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return line.strip() not in ("", "-")


def _rewrite_zip(path: Path, edit: Any) -> None:
    """Rebuild a zip with edit(name, bytes) -> bytes | None (None drops the member)."""
    with zipfile.ZipFile(path) as z:
        members = [(i, z.read(i.filename)) for i in z.infolist()]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for info, data in members:
            new = edit(info.filename, data)
            if new is not None:
                z.writestr(info.filename, new)
        extra = edit(None, b"")
        if extra:
            for name, data in extra:
                z.writestr(name, data)
    path.write_bytes(out.getvalue())


def apply_mutation(m: dict[str, Any], dirs: CaseDirs) -> None:
    src = dirs.src
    p = src / m["file"]
    cls = m["cls"]
    if cls == "flip":
        data = bytearray(p.read_bytes())
        for off, mask in m["flips"]:
            data[off] ^= mask
        p.write_bytes(bytes(data))
    elif cls == "truncate":
        with open(p, "r+b") as f:
            f.truncate(m["size"])
    elif cls == "zero":
        data = bytearray(p.read_bytes())
        data[m["offset"] : m["offset"] + m["length"]] = bytes(
            len(data[m["offset"] : m["offset"] + m["length"]])
        )
        p.write_bytes(bytes(data))
    elif cls == "delete":
        p.unlink()
    elif cls in ("swap-partition", "swap-version"):
        q = src / m["other"]
        a, b = p.read_bytes(), q.read_bytes()
        p.write_bytes(b)
        q.write_bytes(a)
    elif cls in ("json-type", "json-garbage", "deep-json"):
        if m.get("member"):
            _rewrite_zip(
                p,
                lambda name, data: (
                    None
                    if name is None
                    else (
                        _edit_json_text(data.decode("utf-8"), m).encode()
                        if name == m["member"]
                        else data
                    )
                ),
            )
        else:
            p.write_text(_edit_json_text(p.read_text("utf-8", "replace"), m), "utf-8")
    elif cls == "non-utf8":
        data = p.read_bytes()
        p.write_bytes(data[: m["offset"]] + bytes.fromhex(m["bytes"]) + data[m["offset"] :])
    elif cls == "schema":
        _mutate_schema(p, m)
    elif cls == "zip-member":
        _mutate_zip(p, m, dirs)
    elif cls in fuzz_trust.FS_CLASSES:
        fuzz_trust.apply_fs(m, src, dirs.sentinel)
    elif cls in fuzz_trust.FORGED_CLASSES or cls in fuzz_trust.INCONSISTENT_CLASSES:
        fuzz_trust.apply_sp(m, src)
    elif cls.startswith("sp-"):
        _mutate_savepoint(m, dirs)
    else:
        raise ValueError(cls)


def _mutate_schema(p: Path, m: dict[str, Any]) -> None:
    import struct

    rng = random.Random(m["seed"])
    data = p.read_bytes()
    kind = m["kind"]
    # Every schema version starts with writeUTF("vN"); the JSON strings follow as UTF chunks.
    head = data[:4]
    if kind == "chunks":
        # an absurd chunk count or UTF length right after the version line
        pos = 4
        data = (
            data[:pos] + struct.pack(">i", rng.choice([-1, 2**31 - 1, 999_999])) + data[pos + 4 :]
        )
    elif kind == "utf":
        pos = rng.randrange(4, max(5, len(data)))
        data = data[:pos] + b"\xff\xfe" + data[pos + 2 :]
    else:
        # replace the first JSON string (after its 2-byte UTF length) with another JSON text
        start = data.find(b"{", 4)
        if start < 2:
            return
        (n,) = struct.unpack(">H", data[start - 2 : start])
        if kind == "type":
            text = json.dumps(
                rng.choice([[1, 2], {"type": 5}, {"type": "struct", "fields": 3}, None, "x"])
            )
        elif kind == "garbage":
            text = rng.choice(
                ['{"type":', "nonsense", "{}", '{"type":"struct","fields":[{"name":1}]}']
            )
        else:
            text = "[" * 50_000 + "]" * 50_000
        enc = text.encode()[:65535]
        data = data[: start - 2] + struct.pack(">H", len(enc)) + enc + data[start + n :]
    del head
    p.write_bytes(data)


def _mutate_zip(p: Path, m: dict[str, Any], dirs: CaseDirs) -> None:
    rng = random.Random(m["seed"])
    kind = m["kind"]
    store_dir = p.parent
    # The reader extracts into a temporary directory under tmp/ (TMPDIR), one level down.
    extract_dir = dirs.tmp / "statectl-rocksdb-x"
    rel_to_sentinel = os.path.relpath(dirs.sentinel / "pwned", extract_dir)
    if kind == "member-traversal":
        _rewrite_zip(
            p,
            lambda name, data: (
                [
                    (rel_to_sentinel + "-member", b"pwned"),
                    ("/" + str(dirs.sentinel / "abs-member"), b"x"),
                ]
                if name is None
                else data
            ),
        )
        return
    if kind == "deflate-damage":
        # flip bytes inside the compressed stream of one deflated member: zlib.error or CRC error
        with zipfile.ZipFile(p) as z:
            infos = [i for i in z.infolist() if i.compress_size > 8]
        if not infos:
            return
        info = rng.choice(infos)
        data = bytearray(p.read_bytes())
        hdr = info.header_offset
        name_len = int.from_bytes(data[hdr + 26 : hdr + 28], "little")
        extra_len = int.from_bytes(data[hdr + 28 : hdr + 30], "little")
        body = hdr + 30 + name_len + extra_len
        for _ in range(3):
            off = body + rng.randrange(info.compress_size)
            data[off] ^= 0xFF
        p.write_bytes(bytes(data))
        return

    def edit_meta(name: str | None, data: bytes) -> Any:
        if name != "metadata":
            return None if name is None else data
        head, _, body = data.decode().partition("\n")
        obj = json.loads(body)
        ssts = obj.get("sstFiles") or []
        if kind == "metadata-types":
            paths = _json_paths(obj)
            obj = _set_path(obj, rng.choice(paths), rng.choice(WRONG_VALUES))
        elif ssts:
            e = rng.choice(ssts)
            if kind == "local-traversal":
                e["localFileName"] = rel_to_sentinel
            elif kind == "local-absolute":
                e["localFileName"] = str(dirs.sentinel / "pwned-abs")
            elif kind == "dfs-traversal":
                # a real SST copied into the sentinel dir: reading it would even "work"
                real = store_dir / "SSTs" / e["dfsSstFileName"]
                if real.is_file():
                    shutil.copy(real, dirs.sentinel / "secret.sst")
                e["dfsSstFileName"] = os.path.relpath(
                    dirs.sentinel / "secret.sst", store_dir / "SSTs"
                )
        return (head + "\n" + json.dumps(obj)).encode()

    _rewrite_zip(p, edit_meta)


# -- crafted savepoints ------------------------------------------------------------------------


def plan_savepoint_mutation(rng: random.Random, cls: str, sp: Path) -> dict[str, Any] | None:
    meta = json.loads((sp / "_metadata").read_text())
    files = [
        (oi, ti, fi)
        for oi, o in enumerate(meta["operators"])
        for ti, t in enumerate(o["tables"])
        for fi, _ in enumerate(t["files"])
    ]
    m: dict[str, Any] = {"cls": cls, "file": "_metadata"}
    if cls in (
        "sp-abs-path",
        "sp-dotdot-path",
        "sp-symlink",
        "sp-drop-file",
        "sp-sha256",
        "sp-rows",
        "sp-bytes",
        "sp-flip",
        "sp-truncate",
    ):
        if not files:
            return None
        m["target"] = list(rng.choice(files))
        m["seed"] = rng.randrange(1 << 30)
    elif cls == "sp-operator-id":
        m["value"] = rng.choice(["../../sentinel/pwned", "/abs/x", -1, 2**40, "0/../../x", None])
        m["field"] = rng.choice(["operator_id", "uid"])
    elif cls == "sp-huge-batch":
        m["value"] = rng.choice([3_000_000, 2**62, -5])
    elif cls == "sp-json-type":
        m["pick"] = rng.randrange(1 << 30)
        m["value"] = rng.choice(WRONG_VALUES)
    else:
        raise ValueError(cls)
    return m


def _mutate_savepoint(m: dict[str, Any], dirs: CaseDirs) -> None:
    sp = dirs.src
    mp = sp / "_metadata"
    meta = json.loads(mp.read_text())
    cls = m["cls"]
    if "target" in m:
        oi, ti, fi = m["target"]
        table = meta["operators"][oi]["tables"][ti]
        entry = table["files"][fi]
        data_file = sp / entry["path"]
        rng = random.Random(m["seed"])
        if cls in ("sp-abs-path", "sp-dotdot-path", "sp-symlink"):
            # the sentinel holds an exact copy: a reader that follows the path gets "right" rows
            copy = dirs.sentinel / "data.parquet"
            shutil.copy(data_file, copy)
            if cls == "sp-abs-path":
                entry["path"] = str(copy)
            elif cls == "sp-dotdot-path":
                entry["path"] = os.path.relpath(copy, sp)
            else:
                data_file.unlink()
                data_file.symlink_to(copy)
        elif cls == "sp-drop-file":
            table["files"].pop(fi)
        elif cls == "sp-sha256":
            entry["sha256"] = hashlib.sha256(b"other").hexdigest()
        elif cls == "sp-rows":
            entry["rows"] = entry["rows"] + rng.choice([-1, 1, 1000])
        elif cls == "sp-bytes":
            entry["bytes"] = entry["bytes"] + rng.choice([-1, 1, 1000])
        elif cls == "sp-flip":
            data = bytearray(data_file.read_bytes())
            off = rng.randrange(len(data))
            data[off] ^= 1 << rng.randrange(8)
            data_file.write_bytes(bytes(data))
        elif cls == "sp-truncate":
            data = data_file.read_bytes()
            data_file.write_bytes(data[: rng.randrange(len(data))])
    elif cls == "sp-operator-id":
        meta["operators"][0][m["field"]] = m["value"]
    elif cls == "sp-huge-batch":
        meta["batch_id"] = m["value"]
    elif cls == "sp-json-type" and "path" in m:
        meta = _set_path(meta, tuple(m["path"]), m["value"])
    elif cls == "sp-json-type":
        paths = _json_paths(meta)
        meta = _set_path(meta, paths[m["pick"] % len(paths)], m["value"])
    if cls in CRAFTED_SAVEPOINT:
        # A crafted savepoint carries a valid seal (an attacker recomputes it): the checks behind
        # the seal are what these classes test. Other classes are damage, which the seal catches.
        from statectl.savepoints.format import seal

        meta = seal(meta)
    mp.write_text(json.dumps(meta, indent=1))


# -- kill -9 -----------------------------------------------------------------------------------
#
# A writing command runs in a forked grandchild (its own process group, so its pool workers go
# too) and gets SIGKILL after a random delay drawn from [0, 1.1 x its uninterrupted time]. Then
# the harness reads back what it left: every export from the output must be `same` as from an
# uninterrupted run or a clean refusal (an incomplete output must not look complete:
# SILENT-DIFF). Finally the command is re-run as a user at 3 a.m. would (restore/migrate with
# --overwrite when it asks for it) and the exports must be `same` (else NO-RECOVERY).


def kill_commands(fixture: str, cls: str) -> tuple[Command, list[Command]]:
    """The killable command of a class and the exports that read its output back."""
    reads = manifest()[fixture]["reads"]
    if cls == "kill-savepoint":
        cmd = Command(cls, ["savepoint", "{src}", "{out}/sp", "--json"], writes=("sp/", "sp"))
        target = "{sp}"
    elif cls == "kill-restore":
        cmd = Command(cls, ["restore", "{out}/ck", "-s", "{spsrc}", "--json"], writes=("ck",))
        target = "{out}/ck"
    elif cls == "kill-migrate":
        argv = ["migrate", "{src}", "{out}/mk", "--partitions", "3", "--backend", "rocksdb"]
        cmd = Command(cls, [*argv, "--json"], writes=("mk",))
        target = "{out}/mk"
    else:
        raise ValueError(cls)
    verify = [
        Command(
            f"{cls}:verify[{i}]",
            ["export", target, *selection_args(r), "-o", f"{{out}}/{cls}-{i}.jsonl", "--json"],
            f"{cls}-{i}.jsonl",
            writes=(f"{cls}-{i}.jsonl", f".{cls}-{i}.jsonl."),
        )
        for i, r in enumerate(reads)
    ]
    return cmd, verify


def kill_baseline_commands(fixture: str) -> list[Command]:
    cmds: list[Command] = []
    for cls in KILL_CLASSES:
        cmd, verify = kill_commands(fixture, cls)
        cmds += [cmd, *verify]
    return cmds


def _fill(argv: list[str], dirs: CaseDirs, sp_path: str | None) -> list[str]:
    return [
        a.replace("{src}", str(dirs.src))
        .replace("{out}", str(dirs.out))
        .replace("{sp}", str(sp_path))
        .replace("{spsrc}", str(dirs.root / "spsrc"))
        for a in argv
    ]


def _killed_child(argv: list[str], result_path: Path) -> None:
    """The grandchild: run one command, write its result, exit without cleanup."""
    code = 0
    try:
        os.setpgid(0, 0)
        rc, so, se = _run_cli(argv)
        part = result_path.with_suffix(".part")
        part.write_text(json.dumps({"rc": rc, "stdout": so, "stderr": se}))
        part.rename(result_path)  # a kill mid-write leaves no result, not half of one
    except BaseException:
        code = 3
    finally:
        os._exit(code)


def _found_savepoint(dirs: CaseDirs) -> str:
    """The savepoint directory a killed `savepoint` left (complete or not), else a missing path."""
    found = sorted((dirs.out / "sp").glob("savepoint-*")) if (dirs.out / "sp").is_dir() else []
    return str(found[0]) if found else str(dirs.out / "sp" / "none")


def run_kill_case(dirs: CaseDirs, fixture: str, cls: str, delay: float) -> dict[str, Any]:
    """Kill one writing command after ``delay`` seconds, read back, re-run, read back again."""
    cmd, verify = kill_commands(fixture, cls)
    watch = Watch(dirs, log=dirs.tmp / "watch-events.log")
    before = snapshot(dirs.root, (dirs.out, dirs.tmp))
    sys.addaudithook(watch.hook)
    results: list[dict[str, Any]] = []

    watch.writes = cmd.writes
    result_path = dirs.tmp / "killed-result.json"
    argv = _fill(cmd.argv, dirs, None)
    pid = os.fork()
    if pid == 0:
        _killed_child(argv, result_path)
    deadline = time.monotonic() + delay
    while os.waitpid(pid, os.WNOHANG)[0] == 0:  # not finished yet
        if time.monotonic() >= deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            break
        time.sleep(0.002)
    finished = result_path.is_file() and result_path.stat().st_size > 0
    if finished:
        done = json.loads(result_path.read_text())
        # it finished before the kill: judged like any run (an exit 0 compared later)
        results.append(
            _result_dict(
                Result(f"{cls}:finished", done["rc"], done["stdout"], done["stderr"]), dirs
            )
            | {"compare_as": cls}
        )
    killed = not finished
    sp_path = _found_savepoint(dirs) if cls == "kill-savepoint" else None
    if finished and cls == "kill-savepoint" and done["rc"] == 0:
        sp_path = json.loads(done["stdout"])["path"].removeprefix("file://")

    def read_back(role: str, sp: str | None) -> None:
        for v in verify:
            # its own output file per read-back (an export never overwrites)
            v = Command(
                v.name,
                [a.replace(f"{cls}-", f"{cls}-{role}-") for a in v.argv],
                (v.output_file or "").replace(f"{cls}-", f"{cls}-{role}-"),
                writes=tuple(w.replace(f"{cls}-", f"{cls}-{role}-") for w in v.writes),
            )
            watch.writes = v.writes
            r = _run_in_process(v, dirs, sp)
            r.name = v.name.replace(":verify", f":{role}")
            results.append(_result_dict(r, dirs) | {"compare_as": v.name, "role": role})

    # Killed after the restore/migrate wrote its real `metadata` (its last file) but before the
    # command exited: the output is complete, must read back the same, and is not re-run
    # (restore rightly refuses to overwrite a checkpoint).
    completed = not finished and cls != "kill-savepoint" and _wrote_real_metadata(dirs, cls)
    read_back("after-complete" if completed else "after-kill", sp_path)
    if completed or (finished and done["rc"] == 0):
        # nothing to recover (and restore/migrate rightly refuse to overwrite a checkpoint)
        watch.active = False
        events = list(watch.events) + watch.logged()
        events += diff_snapshots(before, snapshot(dirs.root, (dirs.out, dirs.tmp)))
        return {"results": results, "events": events, "killed": completed}
    # recovery: the same command again; restore/migrate ask for --overwrite after an interrupt
    watch.writes = cmd.writes
    rerun = _run_in_process(cmd, dirs, None)
    if rerun.rc == 2 and cls != "kill-savepoint":
        rerun = _run_in_process(
            Command(cmd.name, [*cmd.argv, "--overwrite"], writes=cmd.writes), dirs, None
        )
    rerun.name = f"{cls}:rerun"
    results.append(_result_dict(rerun, dirs) | {"compare_as": cls, "role": "rerun"})
    if rerun.rc == 0:
        if cls == "kill-savepoint":
            sp_path = json.loads(rerun.stdout)["path"].removeprefix("file://")
        read_back("after-rerun", sp_path)
    watch.active = False
    events = list(watch.events) + watch.logged()
    events += diff_snapshots(before, snapshot(dirs.root, (dirs.out, dirs.tmp)))
    return {"results": results, "events": events, "killed": killed}


def _wrote_real_metadata(dirs: CaseDirs, cls: str) -> bool:
    """The restore/migrate target has its final ``metadata`` (``{"id": ...}``), not the marker."""
    meta = dirs.out / ("ck" if cls == "kill-restore" else "mk") / "metadata"
    try:
        return "id" in json.loads(meta.read_text())
    except (OSError, ValueError, TypeError):
        return False


def _run_in_process(c: Command, dirs: CaseDirs, sp_path: str | None) -> Result:
    argv = _fill(c.argv, dirs, sp_path)
    t0 = time.perf_counter()
    rc, so, se = _run_cli(argv)
    r = Result(c.name, rc, so, se, seconds=time.perf_counter() - t0, argv=argv)
    if rc == 0 and c.output_file:
        f = dirs.out / c.output_file
        if f.is_file():
            r.output = "\n".join(sorted(f.read_text("utf-8", "replace").splitlines()))
    return r


def classify_kill(r: dict[str, Any], base: dict[str, Any] | None) -> str:
    """A read-back after the kill may be refused cleanly; after the re-run it must be same."""
    outcome = classify(r, base)
    if r.get("role") == "rerun":
        # the re-run's JSON names a new savepoint / says it overwrote: only its exit counts
        if outcome in ("TRACEBACK", "CRASH"):
            return outcome
        return "same" if r["rc"] == 0 else "NO-RECOVERY"
    if r.get("role") in ("after-rerun", "after-complete") and outcome == "clean-error":
        return "NO-RECOVERY"
    return outcome


# -- dispose -----------------------------------------------------------------------------------
#
# A savepoint (copied to src/) gets 1-3 perturbations, then `dispose TARGET --yes [--force]`
# runs with the path in one of several spellings. Whatever it does, it may delete only what
# _metadata lists inside the savepoint (plus _metadata and the listed files' .crc sidecars);
# anything else deleted, created or modified is an ESCAPE. Exit 0 must leave no listed file
# and no _metadata (else SILENT-DIFF); a refusal (exit 2) that deleted files must at least
# have removed _metadata first, so nothing incomplete looks complete.

DISPOSE_PERTURBATIONS = [
    "user-file",
    "nested-checkpoint",
    "missing-data-file",
    "unlisted-data-file",
    "crafted-path",
    "copied-metadata",
]
DISPOSE_SPELLINGS = ["plain", "trailing-slash", "dotdot", "cwd-dot", "symlink", "parent-cwd"]


def plan_dispose(rng: random.Random, cls: str) -> dict[str, Any]:
    k = rng.choice([0, 1, 1, 2, 3])
    return {
        "cls": cls,
        "perturb": sorted(rng.sample(DISPOSE_PERTURBATIONS, k)),
        "spelling": rng.choice(DISPOSE_SPELLINGS),
        "seed": rng.randrange(1 << 30),
    }


def _listed(meta: dict[str, Any]) -> list[str]:
    paths = [
        f.get("path")
        for o in meta.get("operators") or []
        for t in o.get("tables") or []
        for f in t.get("files") or []
    ]
    paths += [f.get("path") for f in meta.get("native_logs") or []]
    return [p for p in paths if isinstance(p, str)]


def _perturb_for_dispose(m: dict[str, Any], dirs: CaseDirs) -> Path:
    """Apply the perturbations; returns the directory dispose is pointed at."""
    rng = random.Random(m["seed"])
    sp = dirs.src
    mp = sp / "_metadata"
    meta = json.loads(mp.read_text())
    target = sp
    listed = _listed(meta)
    for p in m["perturb"]:
        if p == "user-file":
            (sp / "NOTES.txt").write_text("the user's own notes\n")
            sub = rng.choice([d for d in sp.rglob("*") if d.is_dir()] or [sp])
            (sub / "user.py").write_text("print('mine')\n")
        elif p == "nested-checkpoint":
            live = sp / "live"
            for d in ("commits", "offsets", "state/0/0"):
                (live / d).mkdir(parents=True, exist_ok=True)
            (live / "metadata").write_text('{"id":"x"}\n')
            (live / "commits" / "0").write_text("v1\n{}\n")
        elif p == "missing-data-file" and listed:
            with contextlib.suppress(FileNotFoundError):
                (sp / rng.choice(listed)).unlink()
        elif p == "unlisted-data-file" and listed:
            src = sp / rng.choice(listed)
            if src.is_file():
                shutil.copy(src, src.with_name("part-99999-unlisted.parquet"))
        elif p == "crafted-path" and listed:
            from statectl.savepoints.format import seal

            victim = rng.choice(["../sentinel/marker", str(dirs.sentinel / "marker")])
            for o in meta["operators"]:
                for t in o["tables"]:
                    for f in t["files"]:
                        if f["path"] == listed[0]:
                            f["path"] = victim
            meta = seal(meta)
            mp.write_text(json.dumps(meta, indent=1))
        elif p == "copied-metadata":
            # a user's project directory with a copy of this _metadata in it
            target = dirs.out / "project"
            (target / "src").mkdir(parents=True, exist_ok=True)
            (target / "src" / "main.py").write_text("print('the pipeline')\n")
            shutil.copy(mp, target / "_metadata")
    return target


def run_dispose_case(dirs: CaseDirs, m: dict[str, Any]) -> dict[str, Any]:
    target = _perturb_for_dispose(m, dirs)
    meta_path = target / "_metadata"
    meta = json.loads(meta_path.read_text())
    real = target.resolve()
    allowed = {"_metadata", "_metadata.crc", ".statectl-dispose"}
    for rel in _listed(meta):
        p = os.path.normpath(os.path.join(real, rel))
        if p.startswith(str(real) + os.sep):
            r = os.path.relpath(p, real)
            allowed |= {r, os.path.join(os.path.dirname(r), f".{os.path.basename(r)}.crc")}
    cwd = os.getcwd()
    spelling = m["spelling"]
    arg = str(target)
    if spelling == "trailing-slash":
        arg += "/"
    elif spelling == "dotdot":
        sub = next((d for d in sorted(target.iterdir()) if d.is_dir()), None)
        arg = f"{sub}/.." if sub else arg
    elif spelling == "symlink":
        link = dirs.out / "link"
        link.symlink_to(target)
        arg = str(link)
    before = snapshot(dirs.root, (dirs.tmp,))
    argv = ["dispose", arg, "--yes", "--json"] + (
        ["--force"] if m["cls"] == "dispose-force" else []
    )
    try:
        if spelling == "cwd-dot":
            os.chdir(target)
            argv[1] = "."
        elif spelling == "parent-cwd":
            os.chdir(target.parent)
            argv[1] = target.name
        rc, so, se = _run_cli(argv)
    finally:
        os.chdir(cwd)
    after = snapshot(dirs.root, (dirs.tmp,))
    changes = diff_snapshots(before, after)
    rel_root = str(real.relative_to(dirs.root.resolve()))
    events: list[str] = []
    deleted: set[str] = set()
    for c in changes:
        what, path = c.split(" ", 1)
        inside = path.startswith(rel_root + "/")
        rel = path[len(rel_root) + 1 :] if inside else None
        if what == "deleted" and rel is not None and rel in allowed:
            deleted.add(rel)
        elif not (what == "created" and path == "out/link"):
            events.append(f"dispose {c}")
    r = Result("dispose", rc, so, se, argv=argv)
    d = _result_dict(r, dirs)
    outcome = classify(d, None) if rc != 0 else "same"
    remaining = [x for x in allowed - {".statectl-dispose"} if (real / x).is_file()]
    if rc == 0 and remaining:
        outcome = "SILENT-DIFF"  # said "deleted" and left listed files behind
        d["stderr"] += f"\nleft behind: {sorted(remaining)[:5]}"
    if rc == 2 and deleted and (real / "_metadata").is_file():
        outcome = "SILENT-DIFF"  # a refusal after deleting data: what is left looks complete
        d["stderr"] += f"\ndeleted {sorted(deleted)[:5]} and kept _metadata"
    d["outcome"] = outcome
    return {"results": [d], "events": events}


def _result_dict(r: Result, dirs: CaseDirs) -> dict[str, Any]:
    return {
        "name": r.name,
        "argv": ["statectl", *r.argv],
        "rc": r.rc,
        "stdout": r.stdout[-4000:],
        "stderr": r.stderr
        if len(r.stderr) < 6000
        else r.stderr[:1000] + "\n...\n" + r.stderr[-3000:],
        "traceback": "Traceback (most recent call last)" in r.stderr,
        "norm": _normalize_stdout(r.stdout, dirs),
        "output": r.output,
        "seconds": r.seconds,
    }


# -- running one case --------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    rc: int | None
    stdout: str
    stderr: str
    output: str | None = None  # normalized output file content
    seconds: float = 0.0
    argv: list[str] = field(default_factory=list)


def _normalize_stdout(text: str, dirs: CaseDirs) -> Any:
    for base in (str(dirs.root.resolve()), str(dirs.root)):
        text = text.replace(base, "<case>")
    try:
        obj = json.loads(text)
    except ValueError:
        return text
    return _strip_volatile(obj)


_VOLATILE = {
    "path",
    "bytes",
    "files",
    "created_at",
    "size",
    "target",
    "savepoint",
    "problems",
    "health",
    # what a checkpoint says about itself beyond its state: the query id (Spark makes a new one
    # when `metadata` is gone) and the extent of its logs (old entries may be purged)
    "query_id",
    "offset_batches",
    "commit_batches",
    "uncommitted_batches",
    # a source's one-line summary restates its offset and position (compared) and the count of
    # its sources/ files (like "files": an unread file deleted is reported, not a difference)
    "summary",
}


def _strip_volatile(obj: Any) -> Any:
    """Drop what legitimately differs between two runs or with damage to unread files."""
    if isinstance(obj, dict):
        return {k: _strip_volatile(v) for k, v in obj.items() if k not in _VOLATILE}
    if isinstance(obj, list):
        return [_strip_volatile(v) for v in obj]
    return obj


_COMMAND_TIMEOUT: float | None = None  # set in a case's child (FS_FAMILIES)


class CommandHang(BaseException):
    """A command outlived ``_COMMAND_TIMEOUT`` (blocked on a FIFO, reading /dev/zero)."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise CommandHang()


def _run_cli(argv: list[str]) -> tuple[int, str, str]:
    """statectl's main() in this process, stdout/stderr captured, any escape as a traceback;
    a command past ``_COMMAND_TIMEOUT`` is interrupted and reported with exit code -1 (HANG)."""
    from statectl import cli

    out, err = io.StringIO(), io.StringIO()
    cli._state["debug"] = False
    old_argv = sys.argv
    sys.argv = ["statectl", *argv]
    rc = 0
    if _COMMAND_TIMEOUT:
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, _COMMAND_TIMEOUT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main()
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except CommandHang:
                rc = -1
            except BaseException:
                err.write("TRACEBACK (escaped main()):\n" + traceback.format_exc())
                rc = 1
    finally:
        if _COMMAND_TIMEOUT:
            signal.setitimer(signal.ITIMER_REAL, 0)
        sys.argv = old_argv
    return rc, out.getvalue(), err.getvalue()


def run_commands(dirs: CaseDirs, commands: list[Command]) -> tuple[list[Result], list[str]]:
    """Run every command; returns results and ESCAPE events. Call in a disposable process."""
    watch = Watch(dirs)
    skip = (dirs.out, dirs.tmp)
    before = snapshot(dirs.root, skip)
    sys.addaudithook(watch.hook)
    results: list[Result] = []
    ok: dict[str, bool] = {}
    sp_path = None
    for c in commands:
        if c.needs and not ok.get(c.needs):
            continue
        argv = [
            a.replace("{src}", str(dirs.src))
            .replace("{out}", str(dirs.out))
            .replace("{sp}", str(sp_path))
            .replace("{spsrc}", str(dirs.root / "spsrc"))
            for a in c.argv
        ]
        watch.writes = c.writes
        t0 = time.perf_counter()
        rc, so, se = _run_cli(argv)
        r = Result(c.name, rc, so, se, seconds=time.perf_counter() - t0, argv=argv)
        ok[c.name] = rc == 0
        if c.name in ("savepoint", "kill-savepoint") and rc == 0:
            with contextlib.suppress(ValueError, KeyError):
                sp_path = json.loads(so)["path"].removeprefix("file://")
        if rc == 0 and c.output_file:
            f = dirs.out / c.output_file
            if f.is_file():
                r.output = "\n".join(sorted(f.read_text("utf-8", "replace").splitlines()))
        results.append(r)
    watch.active = False  # audit hooks cannot be removed; the harness's own reads don't count
    events = list(watch.events)
    after = snapshot(dirs.root, skip)
    events += diff_snapshots(before, after)
    return results, events


def _json_error(stdout: str) -> bool:
    """stdout is the CLI's JSON error object: one line of error text, exit code 2."""
    try:
        obj = json.loads(stdout)
    except ValueError:
        return False
    return (
        isinstance(obj, dict)
        and obj.get("exit_code") == 2
        and isinstance(obj.get("error"), str)
        and "\n" not in obj["error"]
    )


def _json_refusal(stdout: str) -> bool:
    """Under --json a failure is one JSON document on stdout: an error object, or a restore
    plan whose ``problems`` say why it was refused."""
    if _json_error(stdout):
        return True
    try:
        obj = json.loads(stdout)
    except ValueError:
        return False
    return isinstance(obj, dict) and bool(obj.get("problems")) and obj.get("ok") is not True


def classify(r: dict[str, Any], base: dict[str, Any] | None) -> str:
    rc, err = r["rc"], r["stderr"]
    if rc == -1:  # interrupted by the per-command timeout (see _run_cli)
        return "HANG"
    if r.get("traceback") or "Traceback (most recent call last)" in err:
        return "TRACEBACK"
    if rc == 0:
        if base is None or base["rc"] != 0:
            return "SILENT-DIFF"
        same = r["norm"] == base["norm"] and r.get("output") == base.get("output")
        return "same" if same else "SILENT-DIFF"
    if rc == 2 and not err.strip() and _json_refusal(r.get("stdout", "")):
        # Under --json an error is one JSON object on stdout (and nothing on stderr).
        same = base is not None and base["rc"] == 2 and base.get("stdout") == r.get("stdout")
        return "same" if same else "clean-error"
    if rc == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        if (
            lines
            and all(line.startswith(("statectl: error: ", "statectl: warning: ")) for line in lines)
            and any(line.startswith("statectl: error: ") for line in lines)
        ):
            return (
                "clean-error"
                if not (base and base["rc"] == 2 and base["stderr"] == err)
                else "same"
            )
        # exit 2 but not one "statectl: error:" line (a multi-line message, raw output)
        return "CRASH"
    return "CRASH"


@dataclass
class Case:
    index: int
    family: str
    fixture: str
    cls: str
    mutation: dict[str, Any] | None = None
    outcome: str = "same"
    commands: list[dict[str, Any]] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    seconds: float = 0.0
    killed: bool | None = None  # kill family: the command was killed before it finished


def commands_for(case_family: str, fixture: str) -> list[Command]:
    if case_family == "kill":
        return kill_baseline_commands(fixture)
    if case_family == "dispose":
        return []
    cmds = savepoint_commands(fixture) if case_family in SP_LIKE else checkpoint_commands(fixture)
    if case_family in FS_FAMILIES:  # `list` opens every savepoint's _metadata below it
        cmds.insert(1, Command("list", ["list", "{src}", "--json"]))
    return cmds


def prepare(dirs: CaseDirs, family: str, fixture: str, base_sp: Path | None) -> None:
    dirs.make()
    if family in (*SP_LIKE, "dispose"):
        assert base_sp is not None
        shutil.copytree(base_sp, dirs.src, symlinks=True)
    else:
        shutil.copytree(FIXTURES / fixture, dirs.src, symlinks=True)
    if family == "nocrc":
        fuzz_trust.strip_checksums(dirs.src)
    if family == "kill":  # kill-restore restores from a savepoint of the fixture
        assert base_sp is not None
        shutil.copytree(base_sp, dirs.root / "spsrc", symlinks=True)


def _child_setup(dirs: CaseDirs) -> None:
    os.environ["TMPDIR"] = str(dirs.tmp)
    os.environ["STATECTL_WORKERS"] = "1"
    os.environ.pop("STATECTL_DEBUG", None)
    tempfile.tempdir = str(dirs.tmp)
    sys.dont_write_bytecode = True


def execute(
    dirs: CaseDirs, family: str, fixture: str, mutation: dict[str, Any] | None, base_sp: Path | None
) -> dict[str, Any]:
    """In a (forked) child: prepare, mutate, run, return raw results."""
    _child_setup(dirs)
    prepare(dirs, family, fixture, base_sp)
    if family == "kill" and mutation is not None:
        return run_kill_case(dirs, fixture, mutation["cls"], mutation["delay"])
    if family == "dispose":
        assert mutation is not None
        return run_dispose_case(dirs, mutation)
    if mutation is not None:
        apply_mutation(mutation, dirs)
    global _COMMAND_TIMEOUT
    _COMMAND_TIMEOUT = COMMAND_TIMEOUT if family in FS_FAMILIES else None
    if family in FS_FAMILIES:
        # a link to /dev/zero read whole must fail in this child, not exhaust a shared machine
        resource.setrlimit(resource.RLIMIT_DATA, (FS_MEMORY, FS_MEMORY))
    results, events = run_commands(dirs, commands_for(family, fixture))
    return {"results": [_result_dict(r, dirs) for r in results], "events": events}


def fork_start(fn: Any, *args: Any) -> tuple[int, str, float]:
    """Fork a child running fn(*args), its JSON result written to a temporary file."""
    fd, result_path = tempfile.mkstemp(prefix="fuzz-result-", suffix=".json")
    os.close(fd)
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # child: never returns
        code = 0
        try:
            os.setpgid(0, 0)
            value = fn(*args)
            with open(result_path, "w") as f:
                json.dump(value, f, default=str)
        except BaseException:
            with open(result_path, "w") as f:
                json.dump({"harness_error": traceback.format_exc()}, f)
            code = 3
        finally:
            os._exit(code)
    return pid, result_path, t0


def _poll(pid: int, result_path: str, deadline: float) -> tuple[str, Any] | None:
    """None while running; ("ok", value) | ("HANG", None) | ("CRASH", detail) | ("HARNESS", tb)."""
    done, status = os.waitpid(pid, os.WNOHANG)
    if not done:
        if time.monotonic() < deadline:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.unlink(result_path)
        return "HANG", None
    try:
        text = Path(result_path).read_text()
    finally:
        os.unlink(result_path)
    if os.WIFSIGNALED(status):
        return "CRASH", f"killed by signal {os.WTERMSIG(status)}"
    if not text:
        return "CRASH", f"exit {os.waitstatus_to_exitcode(status)} without a result"
    value = json.loads(text)
    if "harness_error" in value:
        return "HARNESS", value["harness_error"]
    return "ok", value


def fork_call(fn: Any, timeout: float, *args: Any) -> tuple[str, Any]:
    """fn(*args) in a forked child with a timeout (blocking)."""
    pid, result_path, t0 = fork_start(fn, *args)
    while True:
        res = _poll(pid, result_path, t0 + timeout)
        if res is not None:
            return res
        time.sleep(0.01)


# -- the campaign ------------------------------------------------------------------------------


def _baseline_kind(family: str) -> str:
    """Families that run the same commands on the same intact input share a baseline."""
    if family in ("savepoint", "kill", "dispose", "nocrc", "fsnodes", "sp-fsnodes"):
        return family
    return "savepoint" if family in SP_LIKE else "checkpoint"


def _plan_trust(
    rng: random.Random, family: str, classes: list[str] | None, src: Path
) -> tuple[str, dict[str, Any] | None]:
    """A class and a mutation of one of issue 26's families (bench/fuzz_trust.py)."""
    pools = {
        "fsnodes": fuzz_trust.FS_CLASSES,
        "sp-fsnodes": fuzz_trust.FS_CLASSES,
        "sp-forged": fuzz_trust.FORGED_CLASSES,
        "sp-inconsistent": fuzz_trust.INCONSISTENT_CLASSES,
        "nocrc": CKPT_CLASSES,
    }
    pool = [c for c in pools[family] if not classes or c in classes] or pools[family]
    for _ in range(20):
        cls = rng.choice(pool)
        if family == "nocrc":
            m = plan_mutation(rng, cls, src)
            # the checksum files are gone before the mutation: it must not name one
            if m is not None and (_is_crc(m["file"]) or _is_crc(m.get("other", ""))):
                m = None
        elif family in FS_FAMILIES:
            m = fuzz_trust.plan_fs(rng, cls, src, family == "sp-fsnodes")
        else:
            m = fuzz_trust.plan_sp(rng, cls, src)
        if m is not None:
            return cls, m
    return "none", None


def _reported_unverifiable(results: list[dict[str, Any]], m: dict[str, Any] | None) -> bool:
    """The case's ``inspect --json`` exited 0 and named every file the mutation changed as
    unverifiable."""
    inspect = next((r for r in results if r["name"] == "inspect"), None)
    if m is None or inspect is None or inspect["rc"] != 0 or not isinstance(inspect["norm"], dict):
        return False
    listed = inspect["norm"].get("unverifiable_files") or []
    changed = [m["file"], *([m["other"]] if "other" in m else [])]
    return inspect["norm"].get("verification") == "unverifiable" and all(
        f in listed for f in changed
    )


def _only_newly_unverifiable(r: dict[str, Any], by_name: dict[str, Any]) -> bool:
    """``inspect`` whose one difference from the baseline is that it now says the checkpoint
    is unverifiable (a checksum sidecar deleted): the loss reported, not hidden."""
    base = by_name.get(r["name"])
    if r["name"] != "inspect" or r["rc"] != 0 or base is None or base["rc"] != 0:
        return False
    norm, base_norm = r.get("norm"), base.get("norm")
    if not isinstance(norm, dict) or not isinstance(base_norm, dict):
        return False
    volatile = ("verification", "unverifiable_files")
    return (
        norm.get("verification") == "unverifiable"
        and base_norm.get("verification") != "unverifiable"
        and {k: v for k, v in norm.items() if k not in volatile}
        == {k: v for k, v in base_norm.items() if k not in volatile}
    )


def _list_reports_damage(r: dict[str, Any], m: dict[str, Any] | None) -> bool:
    """``list DIR --json`` exits 0 by design (one damaged entry does not stop the listing): a
    listing whose entry names the mutated file among its problems reported the damage."""
    if r["name"] != "list" or r["rc"] != 0 or m is None or "file" not in m:
        return False
    try:
        entries = json.loads(r["stdout"])
    except ValueError:
        return False
    name = posixpath.basename(m["file"])
    return isinstance(entries, list) and any(
        isinstance(e, dict) and any(name in str(p) for p in e.get("problems") or [])
        for e in entries
    )


class Campaign:
    def __init__(self, workdir: Path, timeout: float = 60.0) -> None:
        self.workdir = workdir
        self.timeout = timeout
        self.baselines: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.base_sp: dict[str, Path] = {}

    def baseline(self, family: str, fixture: str) -> list[dict[str, Any]]:
        kind = _baseline_kind(family)
        key = (kind, fixture)
        if kind == "dispose":
            return []  # judged on its own (what was deleted), not against a baseline
        if key not in self.baselines:
            sp = self.savepoint_of(fixture) if family in SP_FAMILIES else None
            dirs = CaseDirs(self.workdir / f"baseline-{kind}-{fixture}")
            status, value = fork_call(execute, self.timeout * 3, dirs, family, fixture, None, sp)
            shutil.rmtree(dirs.root, ignore_errors=True)
            if status != "ok":
                raise RuntimeError(f"baseline of {fixture} failed: {status} {value}")
            for r in value["results"]:
                if classify(r, None) == "TRACEBACK":
                    raise RuntimeError(f"baseline {fixture} {r['name']}: {r['stderr']}")
            self.baselines[key] = value["results"]
        return self.baselines[key]

    def savepoint_of(self, fixture: str) -> Path:
        if fixture not in self.base_sp:
            target = self.workdir / "base-savepoints" / fixture

            def make() -> dict[str, Any]:
                os.environ["STATECTL_WORKERS"] = "1"
                rc, so, se = _run_cli(["savepoint", str(FIXTURES / fixture), str(target), "--json"])
                return {"rc": rc, "stdout": so, "stderr": se}

            status, value = fork_call(make, self.timeout * 3)
            if status != "ok" or value["rc"] != 0:
                raise RuntimeError(f"cannot take a savepoint of {fixture}: {value}")
            self.base_sp[fixture] = Path(
                json.loads(value["stdout"])["path"].removeprefix("file://")
            )
        return self.base_sp[fixture]

    def plan(
        self, seed: int, index: int, families: list[str], classes: list[str] | None = None
    ) -> Case:
        rng = random.Random(f"{seed}:{index}")
        family = families[index % len(families)]
        fixture = rng.choice(FAMILIES[family])
        if family == "kill":
            cls = rng.choice(
                [c for c in KILL_CLASSES if not classes or c in classes] or KILL_CLASSES
            )
            base = {r["name"]: r for r in self.baseline(family, fixture)}
            fraction = round(rng.uniform(0.0, 1.1), 4)
            delay = round(fraction * base[cls]["seconds"], 4)
            return Case(
                index, family, fixture, cls, {"cls": cls, "fraction": fraction, "delay": delay}
            )
        if family == "dispose":
            self.savepoint_of(fixture)
            cls = rng.choice(DISPOSE_CLASSES)
            return Case(index, family, fixture, cls, plan_dispose(rng, cls))
        if family in ("nocrc", "sp-forged", "sp-inconsistent", *FS_FAMILIES):
            src = self.savepoint_of(fixture) if family in SP_LIKE else FIXTURES / fixture
            cls, m = _plan_trust(rng, family, classes, src)
            return Case(index, family, fixture, cls, m)
        pool = SP_CLASSES if family == "savepoint" else CKPT_CLASSES
        if classes:
            pool = [c for c in pool if c in classes] or pool
        # fall back to another class when the drawn one does not apply to this fixture
        for _ in range(20):
            cls = rng.choice(pool)
            src = self.savepoint_of(fixture) if family == "savepoint" else FIXTURES / fixture
            m = (plan_savepoint_mutation if family == "savepoint" else plan_mutation)(rng, cls, src)
            if m is not None:
                return Case(index, family, fixture, cls, m)
        return Case(index, family, fixture, "none", None)

    def resolve_delay(self, case: Case) -> None:
        """A kill case given as a ``fraction`` of the command's uninterrupted time (what the
        machine takes today) gets its delay in seconds."""
        m = case.mutation
        if case.family == "kill" and m is not None and "delay" not in m:
            base = {r["name"]: r for r in self.baseline(case.family, case.fixture)}
            m["delay"] = round(m["fraction"] * base[m["cls"]]["seconds"], 4)

    def run(self, case: Case, keep: bool = False) -> Case:
        """Run one case in a forked child and classify it (blocking)."""
        base = self.baseline(case.family, case.fixture)
        self.resolve_delay(case)
        sp = self.savepoint_of(case.fixture) if case.family in SP_FAMILIES else None
        dirs = self.case_dirs(case)
        t0 = time.monotonic()
        status, value = fork_call(
            execute, self.timeout_of(case), dirs, case.family, case.fixture, case.mutation, sp
        )
        return self.finish(case, status, value, base, time.monotonic() - t0, dirs, keep)

    def case_dirs(self, case: Case) -> CaseDirs:
        return CaseDirs(self.workdir / f"case-{case.index:06d}")

    def start(self, case: Case) -> tuple[int, str, float]:
        """Fork the child of one case (non-blocking); poll() it."""
        sp = self.savepoint_of(case.fixture) if case.family in SP_FAMILIES else None
        self.baseline(case.family, case.fixture)
        self.resolve_delay(case)
        pid, result_path, t0 = fork_start(
            execute, self.case_dirs(case), case.family, case.fixture, case.mutation, sp
        )
        return pid, result_path, t0, self.timeout_of(case)

    def timeout_of(self, case: Case) -> float:
        """The case's timeout; in the FS families every command may use its own timeout."""
        if case.family not in FS_FAMILIES:
            return self.timeout
        n = len(commands_for(case.family, case.fixture))
        return max(self.timeout, COMMAND_TIMEOUT * (n + 1))

    def poll(self, handle: tuple[int, str, float, float]) -> tuple[str, Any] | None:
        pid, result_path, t0, timeout = handle
        return _poll(pid, result_path, t0 + timeout)

    def finish(
        self,
        case: Case,
        status: str,
        value: Any,
        base: list[dict[str, Any]] | None,
        seconds: float,
        dirs: CaseDirs | None = None,
        keep: bool = False,
    ) -> Case:
        if base is None:
            base = self.baseline(case.family, case.fixture)
        case.seconds = seconds
        if status == "ok":
            by_name = {b["name"]: b for b in base}
            worst = "same"
            for r in value["results"]:
                if "outcome" in r:  # judged in the child (dispose)
                    outcome = r["outcome"]
                elif case.family == "kill":
                    outcome = classify_kill(r, by_name.get(r.get("compare_as", r["name"])))
                else:
                    outcome = classify(r, by_name.get(r["name"]))
                    if (
                        outcome == "SILENT-DIFF"
                        and case.family == "nocrc"
                        and _reported_unverifiable(value["results"], case.mutation)
                    ):
                        outcome = "unverifiable"
                    if outcome == "SILENT-DIFF" and _list_reports_damage(r, case.mutation):
                        outcome = "clean-error"
                    if outcome == "SILENT-DIFF" and _only_newly_unverifiable(r, by_name):
                        outcome = "unverifiable"
                case.commands.append(
                    {
                        "name": r["name"],
                        "argv": r.get("argv"),
                        "outcome": outcome,
                        "rc": r["rc"],
                        "stderr": r["stderr"][-1500:],
                        "stdout": r["stdout"][-1500:] if outcome != "same" else "",
                        "seconds": round(r["seconds"], 3),
                    }
                )
                if SEVERITY[outcome] > SEVERITY[worst]:
                    worst = outcome
            case.events = value["events"]
            case.killed = value.get("killed")
            if case.events:
                worst = "ESCAPE"
            case.outcome = worst
        elif status == "HARNESS":
            raise RuntimeError(f"harness error in case {case.index} ({case.mutation}):\n{value}")
        else:
            case.outcome = status
            case.events = [str(value)] if value else []
        if not keep:
            shutil.rmtree((dirs or self.case_dirs(case)).root, ignore_errors=True)
        return case


def run_cases(
    camp: Campaign,
    cases: list[Case],
    jobs: int,
    on_done: Any = None,
    deadline: float | None = None,
) -> list[Case]:
    """Run cases, ``jobs`` forked children at a time; on_done(case, done) after each. Past
    ``deadline`` (time.monotonic()) or after SIGINT/SIGTERM no new case starts; the running
    ones finish (each is bounded by the timeout) so the table covers every started case."""
    todo = list(cases)
    done: list[Case] = []
    running: dict[int, tuple[Case, Any]] = {}
    stop = [False]

    def _stop(signum: int, frame: Any) -> None:
        stop[0] = True

    old = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        _run_loop(camp, todo, done, running, jobs, on_done, deadline, stop)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    return done


def _run_loop(
    camp: Campaign,
    todo: list[Case],
    done: list[Case],
    running: dict[int, tuple[Case, Any]],
    jobs: int,
    on_done: Any,
    deadline: float | None,
    stop: list[bool],
) -> None:
    while todo or running:
        if stop[0] or (deadline is not None and time.monotonic() > deadline):
            todo.clear()
        while todo and len(running) < jobs:
            c = todo.pop(0)
            running[c.index] = (c, camp.start(c))
        for idx in list(running):
            c, handle = running[idx]
            res = camp.poll(handle)
            if res is not None:
                camp.finish(c, res[0], res[1], None, time.monotonic() - handle[2])
                del running[idx]
                done.append(c)
                if on_done:
                    on_done(c, done)
        time.sleep(0.005)


def preload() -> None:
    """Import and warm up everything a command needs before forking, so each child only does
    its own work (typer builds its pydantic adapters on first use: ~0.2 s per child otherwise).
    Safe to fork after: the warm-up leaves no thread behind (checked)."""
    import threading

    import pyarrow.parquet  # noqa: F401
    import rocksdict  # noqa: F401

    import statectl.restoration
    import statectl.savepoints.create  # noqa: F401

    with tempfile.TemporaryDirectory(prefix="statectl-fuzz-warmup-") as tmp:
        old = os.environ.get("STATECTL_WORKERS")
        os.environ["STATECTL_WORKERS"] = "1"
        try:
            for argv in (
                ["inspect", str(FIXTURES / "agg-rocksdb"), "--json"],
                ["export", str(FIXTURES / "agg-hdfs"), "-o", f"{tmp}/x.jsonl", "--json"],
                ["savepoint", str(FIXTURES / "agg-hdfs"), tmp, "--json"],
            ):
                # In a copy of the context: main() switches messages to the command line's
                # wording, which must not outlive the warm-up in a process that goes on
                # calling the Python API (a pytest worker).
                contextvars.copy_context().run(_run_cli, argv)
        finally:
            if old is None:
                os.environ.pop("STATECTL_WORKERS")
            else:
                os.environ["STATECTL_WORKERS"] = old
    if threading.active_count() != 1:
        raise RuntimeError("the warm-up left threads running: forking would not be safe")


def command_line(case: Case, seed: int) -> str:
    return f"python bench/fuzz.py --seed {seed} --case {case.index} --families {case.family} --keep"


def print_table(cases: list[Case], out: Any = sys.stdout) -> None:
    counts = Counter((c.family, c.cls, c.outcome) for c in cases)
    keys = sorted({(f, k) for f, k, _ in counts})
    w = max([len(f"{f} {k}") for f, k in keys] + [20])
    out.write(f"{'family / mutation':<{w}} " + " ".join(f"{o:>11}" for o in OUTCOMES) + "\n")
    for f, k in keys:
        row = " ".join(f"{counts.get((f, k, o), 0) or '.':>11}" for o in OUTCOMES)
        out.write(f"{f + ' ' + k:<{w}} {row}\n")
    tot = Counter(c.outcome for c in cases)
    out.write(f"{'TOTAL':<{w}} " + " ".join(f"{tot.get(o, 0):>11}" for o in OUTCOMES) + "\n")
    kills = [c for c in cases if c.killed is not None]
    if kills:
        n = sum(1 for c in kills if c.killed)
        out.write(
            f"kill -9: {n} of {len(kills)} commands killed mid-run (the rest finished first)\n"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=3000, help="number of corrupted copies")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated")
    ap.add_argument("--classes", default="", help="only these mutation classes (comma-separated)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    ap.add_argument(
        "--budget",
        type=float,
        default=None,
        help="stop starting cases after this many seconds (the table covers the cases run)",
    )
    ap.add_argument("--case", type=int, default=None, help="replay one case index")
    ap.add_argument("--keep", action="store_true", help="keep case directories")
    ap.add_argument(
        "--failures", default="fuzz-failures.jsonl", help="reproducer file (JSON lines)"
    )
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args(argv)
    families = [f for f in args.families.split(",") if f]
    for f in families:
        if f not in FAMILIES:
            ap.error(f"unknown family {f!r}; known: {', '.join(FAMILIES)}")
    classes = [c for c in args.classes.split(",") if c]
    preload()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="statectl-fuzz-"))
    workdir.mkdir(parents=True, exist_ok=True)
    camp = Campaign(workdir, args.timeout)
    t0 = time.monotonic()
    if args.case is not None:
        case = camp.run(camp.plan(args.seed, args.case, families, classes), keep=args.keep)
        print(json.dumps(case.__dict__, indent=1, default=str))
        print(f"case directory: {workdir / f'case-{case.index:06d}'}" if args.keep else "")
        return 0 if case.outcome in ("same", "clean-error") else 1
    # baselines first (serially), so the forked cases share them
    for fam in families:
        for fx in FAMILIES[fam]:
            camp.baseline(fam, fx)
    print(f"baselines ready in {time.monotonic() - t0:.1f}s; workdir {workdir}", flush=True)
    todo = [camp.plan(args.seed, i, families, classes) for i in range(args.n)]
    fail_path = Path(args.failures)
    fail_path.write_text("")
    last = [time.monotonic()]

    def on_done(c: Case, done: list[Case]) -> None:
        if c.outcome in BAD:
            bad = [x for x in c.commands if x["outcome"] in BAD]
            rec = {
                "index": c.index,
                "seed": args.seed,
                "family": c.family,
                "fixture": c.fixture,
                "class": c.cls,
                "outcome": c.outcome,
                "mutation": c.mutation,
                "commands": bad or c.commands,
                "events": c.events,
                "replay": command_line(c, args.seed),
            }
            with fail_path.open("a") as f:
                f.write(json.dumps(rec, default=str) + "\n")
        if time.monotonic() - last[0] > 15:
            last[0] = time.monotonic()
            tally = Counter(x.outcome for x in done)
            print(
                f"[{len(done)}/{args.n}] {last[0] - t0:.0f}s  "
                + "  ".join(f"{o}={tally[o]}" for o in OUTCOMES if tally[o]),
                flush=True,
            )

    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t1 = time.monotonic()
    done = run_cases(camp, todo, args.jobs, on_done, t1 + args.budget if args.budget else None)
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    wall = time.monotonic() - t1
    n = max(1, len(done))
    print()
    print_table(done)
    print(
        f"\n{len(done)} of {args.n} cases in {wall:.0f}s wall (+{t1 - t0:.0f}s baselines), "
        f"--jobs {args.jobs}: {wall / n:.2f}s wall and {cpu / n:.2f}s CPU per case "
        f"(load average {os.getloadavg()[0]:.1f}); failing cases: {fail_path.resolve()}"
    )
    shutil.rmtree(workdir, ignore_errors=True)
    return 1 if any(c.outcome in BAD for c in done) else 0


if __name__ == "__main__":
    sys.exit(main())
