"""The mutation families of issue 26 for bench/fuzz.py (planning and applying them only; the
campaign, the commands and the classification are fuzz.py's).

    nocrc            a fixture with every checksum file removed (what S3A or a copy tool leaves),
                     then one of the checkpoint mutations: expected the same result, a clean
                     error, or the checkpoint reported ``unverifiable`` naming the changed file
                     (never a silent difference presented as verified)
    fsnodes          a checkpoint file replaced by a FIFO, a symbolic link out of the checkpoint
                     (to a copy in the sentinel directory) or a link to /dev/zero
    sp-fsnodes       the same in a savepoint (its ``_metadata`` or a data file)
    sp-forged        a savepoint data file whose Parquet schema (or partition_id) was forged,
                     its size and sha256 updated in a re-sealed ``_metadata``
    sp-inconsistent  a re-sealed ``_metadata`` that contradicts itself (type vs contents,
                     sources missing from the offsets, table kinds, columns, partitions)
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

FS_CLASSES = ["fifo", "symlink-out", "symlink-dev"]
FORGED_CLASSES = [
    "forge-key-type",
    "forge-value-type",
    "forge-drop-field",
    "forge-rename-column",
    "forge-extra-column",
    "forge-partition-id",
]
INCONSISTENT_CLASSES = [
    "sp-type-native",
    "sp-offsets-drop",
    "sp-sources-key",
    "sp-table-kind",
    "sp-columns",
    "sp-partitions",
]


def strip_checksums(root: Path) -> None:
    """Every Hadoop ``.<name>.crc`` and Spark ``<name>.crc`` under ``root`` removed."""
    for p in list(root.rglob("*.crc")):
        p.unlink()


def _regular(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


# -- FIFOs and symbolic links -----------------------------------------------------------------


def plan_fs(rng: random.Random, cls: str, src: Path, savepoint: bool) -> dict[str, Any] | None:
    """A FIFO or a link in place of one file the commands read."""
    files = [f for f in _regular(src) if not f.endswith(".crc")]
    if savepoint:
        cands = ["_metadata"] + [f for f in files if f.endswith(".parquet")]
    else:
        cands = [
            f
            for f in files
            if f == "metadata"
            or f.split("/")[0] in ("offsets", "commits")
            or (f.startswith("state/") and "/_metadata/" not in f)
        ]
    if not cands:
        return None
    return {"cls": cls, "file": rng.choice(cands)}


def apply_fs(m: dict[str, Any], src: Path, sentinel: Path) -> None:
    p = src / m["file"]
    cls = m["cls"]
    if cls == "fifo":
        p.unlink()
        os.mkfifo(p)
    elif cls == "symlink-out":
        # an exact copy outside: a reader that follows the link gets "right" bytes (an ESCAPE)
        copy = sentinel / ("copy-" + p.name)
        shutil.copy(p, copy)
        p.unlink()
        p.symlink_to(copy)
    elif cls == "symlink-dev":
        p.unlink()
        p.symlink_to("/dev/zero")
    else:
        raise ValueError(cls)


# -- crafted savepoints: forged Parquet, inconsistent _metadata -------------------------------


def _data_files(meta: dict[str, Any]) -> list[tuple[int, int, int]]:
    return [
        (oi, ti, fi)
        for oi, o in enumerate(meta["operators"])
        for ti, t in enumerate(o["tables"])
        for fi, _ in enumerate(t["files"])
    ]


def plan_sp(rng: random.Random, cls: str, sp: Path) -> dict[str, Any] | None:
    meta = json.loads((sp / "_metadata").read_text())
    files = _data_files(meta)
    m: dict[str, Any] = {"cls": cls, "file": "_metadata", "seed": rng.randrange(1 << 30)}
    if cls in FORGED_CLASSES:
        nonempty = [
            t
            for t in files
            if meta["operators"][t[0]]["tables"][t[1]]["files"][t[2]]["rows"] > 0
            or cls != "forge-partition-id"
        ]
        if not nonempty:
            return None
        m["target"] = list(rng.choice(nonempty))
        return m
    if cls == "sp-type-native" and meta.get("savepoint_type") != "canonical":
        return None
    if cls in ("sp-offsets-drop", "sp-sources-key") and not meta.get("offsets"):
        return None
    if cls == "sp-table-kind" and not files:
        return None
    return m


def _forge_table(cls: str, t: Any, rng: random.Random) -> Any:
    """The table of one data file, forged as ``cls`` says (pyarrow imported late: the
    harness forks children that import it anyway)."""
    import pyarrow as pa

    if cls == "forge-partition-id":
        i = t.schema.get_field_index("partition_id")
        return t.set_column(i, "partition_id", pa.array([7] * t.num_rows, pa.int32()))
    if cls == "forge-rename-column":
        names = list(t.column_names)
        names[0] = names[0] + "_x"
        return t.rename_columns(names)
    if cls == "forge-extra-column":
        return t.append_column("extra", pa.array([1] * t.num_rows, pa.int64()))
    col = 0 if cls == "forge-key-type" else min(1, t.num_columns - 1)
    c = t.column(col).combine_chunks()
    if pa.types.is_struct(c.type) and c.type.num_fields:
        fields = [c.field(i) for i in range(c.type.num_fields)]
        names = [c.type.field(i).name for i in range(c.type.num_fields)]
        k = rng.randrange(len(fields))
        if cls == "forge-drop-field" and len(fields) > 1:
            del fields[k], names[k]
        else:
            fields[k] = _other_type(fields[k], pa)
        new = pa.StructArray.from_arrays(fields, names=names)
    else:
        new = _other_type(c, pa)
    return t.set_column(col, t.column_names[col], new)


def _other_type(arr: Any, pa: Any) -> Any:
    """``arr`` as another type (ints where there were strings, strings elsewhere)."""
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        return pa.array(range(len(arr)), pa.int64())
    if pa.types.is_integer(arr.type):
        return pa.array([str(v) for v in arr.to_pylist()], pa.string())
    return pa.array([0] * len(arr), pa.int32())


def _rewrite(sp: Path, entry: dict[str, Any], table: Any) -> None:
    import pyarrow.parquet as pq

    path = sp / entry["path"]
    pq.write_table(table, path)
    data = path.read_bytes()
    entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()


def apply_sp(m: dict[str, Any], sp: Path) -> None:
    """Forge or contradict, then re-seal ``_metadata`` as an attacker would."""
    import pyarrow.parquet as pq

    from statectl.savepoints.format import seal

    mp = sp / "_metadata"
    meta = json.loads(mp.read_text())
    rng = random.Random(m["seed"])
    cls = m["cls"]
    if cls in FORGED_CLASSES:
        oi, ti, fi = m["target"]
        entry = meta["operators"][oi]["tables"][ti]["files"][fi]
        _rewrite(sp, entry, _forge_table(cls, pq.read_table(sp / entry["path"]), rng))
    else:
        _contradict(cls, meta, rng)
    mp.write_text(json.dumps(seal(meta), indent=1))


def _contradict(cls: str, meta: dict[str, Any], rng: random.Random) -> None:
    ops = meta["operators"]
    if cls == "sp-type-native":
        meta["savepoint_type"] = "native"
    elif cls == "sp-offsets-drop":
        meta["offsets"].pop(rng.choice(sorted(meta["offsets"])))
    elif cls == "sp-sources-key":
        for e in meta.get("sources") or []:
            e["key"] = str(int(e["key"]) + 5) if str(e["key"]).isdigit() else e["key"] + "x"
        for k in list(meta.get("source_logs") or {}):
            meta["source_logs"][k + "9"] = meta["source_logs"].pop(k)
    elif cls == "sp-table-kind" and ops:
        t = rng.choice([t for o in ops for t in o["tables"]])
        t["kind"] = rng.choice(
            ["store", "join-store", "ValueState", "ListState", "MapState", "timers"]
        )
    elif cls == "sp-columns" and ops:
        t = rng.choice([t for o in ops for t in o["tables"]])
        t["columns"] = [*reversed(t["columns"]), "extra"]
    elif cls == "sp-partitions":
        meta["source_checkpoint"]["partitions"] = rng.choice([1, 3, 200])
        if ops:
            ops[0]["partitions"] = ops[0]["partitions"] + 1
