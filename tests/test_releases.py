"""Checkpoints written by the older Spark release lines (fixtures ``spark35-*``, ``spark40-*``,
``spark41-*``, ``spark42-*``, written by fixtures/generate_release.sh): a savepoint of each
restores (another partition count, often the other backend) and Spark 4.3 continues the very
query that wrote it with the output of an uninterrupted 4.3 run; restored checkpoint format v2
state carries the JSON CRC32C ``<file>.crc`` sidecars Spark verifies.

Reading them (export equals Spark 4.3's ``statestore`` reader, savepoints equal the checkpoint)
is proven by the generic manifest-driven tests (test_export_vs_spark, test_savepoint, ...).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statectl.checkpoint.model import Checkpoint
from statectl.checksums import check_spark_checksum
from statectl.restoration import restore
from statectl.savepoints.create import take_savepoint
from statectl.savepoints.store import table_selection
from statectl.state import read_state
from tests.helpers.fixtures import FIXTURES, ROOT, fixture_generator, load_manifest, restore_target
from tests.helpers.rows import arrow_rows, normalize
from tests.helpers.spark import PROVIDERS, run

generate = fixture_generator()

RELEASE = re.compile(r"^spark(\d)(\d)-")
CHECKSUM_CONF = "spark.sql.streaming.checkpoint.fileChecksum.enabled"
# Confs of a fixture that choose where state lives, not what the query computes.
STORAGE_CONFS = {
    "spark.sql.streaming.stateStore.providerClass",
    generate.CHANGELOG,
    generate.CKPT_VERSION,
}


def release_of(name: str) -> str:
    m = RELEASE.match(name)
    assert m, name
    return f"{m.group(1)}.{m.group(2)}"


RELEASE_FIXTURES = [fx for fx in load_manifest() if RELEASE.match(fx["name"])]


# Confs that choose the backend; checkpoint format v2 stays a difference of its own (its
# continuation is what proves the restored ``.crc`` sidecars).
BACKEND_CONFS = {"spark.sql.streaming.stateStore.providerClass", generate.CHANGELOG}
LINES = ["3.5", "4.0", "4.1", "4.2"]


def continued_fixtures(fixtures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fixtures Spark 4.3 continues: one per release line, query and query-shaping confs.

    The other backends' fixtures of the same query are proven without Spark (read equal to
    Spark 4.3's reader, savepoint equal to the checkpoint, restored row for row): from the
    savepoint on, a restore is the same whatever backend the source had. Lines alternate which
    source backend they continue (3.5 and 4.1 HDFS, so a restore into RocksDB; 4.0 and 4.2
    RocksDB, into HDFS), so every line pair continues restores into both backends."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for fx in fixtures:
        shaping = sorted((k, v) for k, v in fx["confs"].items() if k not in BACKEND_CONFS)
        groups.setdefault((release_of(fx["name"]), fx["query"], tuple(shaping)), []).append(fx)

    def preference(fx: dict[str, Any]) -> tuple[int, str]:
        order = ["hdfs", "rocksdb", "rocksdb-changelog"]
        if LINES.index(release_of(fx["name"])) % 2:
            order = ["rocksdb", "hdfs", "rocksdb-changelog"]
        return order.index(fx["backend"]), fx["name"]

    return sorted((min(g, key=preference) for g in groups.values()), key=lambda fx: fx["name"])


def _cell(fx: dict[str, Any]) -> Any:
    return pytest.param(
        fx, *restore_target(fx), id=f"{fx['name']}-to-{'-'.join(map(str, restore_target(fx)))}"
    )


RESTORE = [_cell(fx) for fx in RELEASE_FIXTURES]
CONTINUE = [_cell(fx) for fx in continued_fixtures(RELEASE_FIXTURES)]


def _state_tables(ckpt: Checkpoint, meta) -> dict[tuple[int, str], list]:
    out = {}
    for op in meta.operators:
        for table in op.tables:
            t = read_state(ckpt, table_selection(op.operator_id, table))
            out[op.operator_id, table.name] = sorted(
                arrow_rows(t.drop_columns(["partition_id"])), key=repr
            )
    return out


def spark_json_checksums(root: Path) -> list[Path]:
    """Spark's JSON ``<file>.crc`` sidecars (not Hadoop's hidden ``.<file>.crc``)."""
    return [p for p in root.rglob("*.crc") if not p.name.startswith(".")]


@pytest.mark.parametrize(("fx", "backend", "partitions"), RESTORE)
def test_release_fixture_restores_row_for_row(tmp_path, fx, backend, partitions):
    """Without Spark: the restored state equals the source state, every key sits in one of
    the new partitions, and every file a checkpoint-format-v2 restore writes that Spark
    checksums (the zips) has a correct CRC32C ``.crc``; a v1 restore writes none."""
    url, meta = take_savepoint(str(FIXTURES / fx["name"]), str(tmp_path / "sp"))
    target = tmp_path / "ck"
    plan = restore(url, str(target), backend=backend, partitions=partitions)
    assert not plan.problems
    src, dst = Checkpoint.open(str(FIXTURES / fx["name"])), Checkpoint.open(str(target))
    assert dst.latest_committed_batch == src.latest_committed_batch
    assert _state_tables(dst, meta) == _state_tables(src, meta)
    # The log versions stay (offset log v2's named sources, commit log v3's sink metadata).
    b = src.latest_committed_batch
    assert dst.offsets(b).version == src.offsets(b).version
    assert dst.offsets(b).metadata_extra == src.offsets(b).metadata_extra
    if src.commit(b).version == 3:
        assert dst.commit(b).version == 3 and dst.commit(b).extra == src.commit(b).extra
    assert dst.checkpoint_format_version(b) == plan.checkpoint_format
    sidecars = spark_json_checksums(target)
    zips = sorted(target.rglob("*.zip"))
    if plan.checkpoint_format == 2:
        assert zips and sorted(p.with_suffix("") for p in sidecars) == zips
        for crc in sidecars:
            main = crc.with_suffix("")
            check_spark_checksum(main.read_bytes(), crc.read_bytes(), str(main), str(crc))
    else:
        assert sidecars == []


def _recorded_input(meta) -> Path:
    """The input directory the fixture's query read (its file source log names it)."""
    entries = next(iter(meta.source_logs.values()))
    return Path(entries[0]["path"].removeprefix("file://").removeprefix("file:")).parent


def sink_name(confs: dict[str, str]) -> str | None:
    """Sink evolution (commit log v3) wants a named sink: the name the generator gave it."""
    return "out" if confs.get(generate.SINK_EVOLUTION) == "true" else None


_SPECS = {sp["name"]: sp for sp in [*generate.fixture_specs(), *generate.release_only_specs()]}


def spec_of(fx: dict[str, Any]) -> dict[str, Any]:
    """The generator's spec of the 4.3 fixture a release fixture repeats."""
    return _SPECS[RELEASE.sub("", fx["name"])]


def write_events(fx: dict[str, Any], d: Path, batches: int) -> list[Path]:
    """The fixture's input files, and two more after it: session windows start batches at
    their own offsets (continued 15 s after the last two)."""
    sp = spec_of(fx)
    offsets = sp.get("offsets")
    if offsets:
        offsets = [*offsets, *(o + 15 for o in offsets[-2:])]
    generate.write_events(d, batches, offsets=offsets, same_time=sp.get("same_time", False))
    return sorted(d.glob("part-*.json"))


def run_files(spark, fx, d: Path, ckpt: Path, files: list[Path], provider=None, confs=None):
    """Like :func:`tests.helpers.spark.run`, for queries that always have another batch
    (transformWithState in ProcessingTime mode, TTL's): one trigger(once) run per file of
    ``files``, each put in place just before its run (fixtures/generate.py writes them so)."""
    staged = d.parent / f"{d.name}-staged"
    staged.mkdir(exist_ok=True)
    for f in files:
        f.rename(staged / f.name)  # rename keeps the modification time
    out: dict[int, list] = {}
    confs = dict(confs or {})
    if provider:
        confs["spark.sql.streaming.stateStore.providerClass"] = PROVIDERS[provider]
    for k, v in confs.items():
        spark.conf.set(k, v)
    try:
        for f in files:
            (staged / f.name).rename(f)
            df, mode = generate.QUERIES[fx["query"]](spark, d)

            def collect(batch, batch_id):
                out[batch_id] = sorted((normalize(tuple(r)) for r in batch.collect()), key=repr)

            q = df.writeStream.foreachBatch(collect).outputMode(mode)
            q.option("checkpointLocation", str(ckpt)).trigger(once=True).start().awaitTermination()
    finally:
        for k in confs:
            spark.conf.unset(k)
    return out


_UNINTERRUPTED: dict[tuple, list] = {}


def uninterrupted(spark, tmp_path_factory, fx: dict[str, Any]) -> list:
    """What one uninterrupted Spark 4.3 run of the fixture's query emits after the fixture's
    input, when two more files arrive: the first run stops where the fixture's did
    (availableNow over the same files), the second continues in the same checkpoint."""
    confs = {k: v for k, v in fx["confs"].items() if k not in STORAGE_CONFS}
    # TWS and join formats 3/4 run on RocksDB only.
    rocksdb_only = fx["query"].startswith("tws") or generate.JOIN_FORMAT in confs
    provider = "rocksdb" if rocksdb_only else "hdfs"
    key = (fx["query"], fx["data_batches"], tuple(sorted(confs.items())))
    if key not in _UNINTERRUPTED:
        d = tmp_path_factory.mktemp("uninterrupted")
        query = generate.QUERIES[fx["query"]]
        first = write_events(fx, d / "in", fx["data_batches"])
        sink = sink_name(confs)
        if spec_of(fx).get("once_per_file"):
            run_files(spark, fx, d / "in", d / "ck", first, provider, confs)
            files = write_events(fx, d / "in", fx["data_batches"] + 2)
            after = run_files(spark, fx, d / "in", d / "ck", files[len(first) :], confs=confs)
        else:
            run(spark, query, d / "in", d / "ck", provider, confs, sink)
            write_events(fx, d / "in", fx["data_batches"] + 2)
            after = run(spark, query, d / "in", d / "ck", confs=confs, sink_name=sink)
        _UNINTERRUPTED[key] = sorted((r for rows in after.values() for r in rows), key=repr)
    return _UNINTERRUPTED[key]


def continue_restored(spark, fx: dict[str, Any], meta, ckpt: Path, confs: dict[str, str]) -> dict:
    """Run the fixture's query on the restored checkpoint with two more input files, in the
    directory the fixture's file source recorded (the source log names files by path)."""
    d = _recorded_input(meta)
    with _recorded_dir(d):
        files = write_events(fx, d, fx["data_batches"] + 2)
        if spec_of(fx).get("once_per_file"):
            return run_files(spark, fx, d, ckpt, files[fx["data_batches"] :], confs=confs)
        query = generate.QUERIES[fx["query"]]
        return run(spark, query, d, ckpt, confs=confs, sink_name=sink_name(confs))


@contextlib.contextmanager
def _recorded_dir(d: Path) -> Iterator[None]:
    """The recorded input directory ``d``, held alone (:func:`_exclusive`), created if it is
    missing and then removed with the parents it needed."""
    with _exclusive(d):
        created = next(p for p in [d, *d.parents] if p.exists() or p.parent.exists())
        created = None if created.exists() else created
        try:
            d.mkdir(parents=True, exist_ok=True)
            yield
        finally:
            if created is not None:
                shutil.rmtree(created, ignore_errors=True)


@contextlib.contextmanager
def _exclusive(d: Path) -> Iterator[None]:
    """Every test of a fixture uses the same recorded input path, and the fixtures of one
    generator run share its temporary root (created and removed here): a test on the other
    xdist worker waits until this one has removed it (else it reads half-removed input)."""
    tmp = Path(tempfile.gettempdir())
    root = tmp / d.relative_to(tmp).parts[0] if d.is_relative_to(tmp) else d
    digest = hashlib.sha256(str(root).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"statectl-input-{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# Checkpoints Spark 4.3 itself refuses to continue, restored or not (the raw checkpoint fails the
# same way): a restore that keeps the writer's state schema is refused alike. Spark 3.5 plans a
# left semi join's left side with non-nullable k and v (the filters imply them), 4.3 with
# nullable ones, and 4.3's schema check refuses the stored value schema. A restore with the
# query (--query) writes 4.3's schema for the same bytes, and 4.3 continues.
SPARK43_REFUSES = {"spark35-join-leftsemi-hdfs": "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE"}


@pytest.mark.spark
@pytest.mark.parametrize(("fx", "backend", "partitions"), CONTINUE)
def test_release_fixture_continues_on_spark43(
    spark, tmp_path, tmp_path_factory, fx, backend, partitions
):
    """Savepoint of a checkpoint an older Spark wrote -> restore -> Spark 4.3 continues the
    query that wrote it (file checksum verification on) and emits exactly what an
    uninterrupted 4.3 run emits for the same new input."""
    if fx["query"] == "tws-ttl":
        # Its values expire TTL_MS after the fixture's first batch (processing time): after
        # that a restored run and a fresh uninterrupted one differ by design. Years: a failure
        # here, not a skip, if that ever comes (regenerate the fixture then).
        from fixtures.generate import TTL_MS

        src = Checkpoint.open(str(FIXTURES / fx["name"]))
        expiry = src.offsets(0).batch_timestamp_ms + TTL_MS
        assert time.time() * 1000 < expiry - 3600 * 1000, (
            f"{fx['name']}'s TTL values expire at {expiry} ms: regenerate it "
            "(fixtures/generate_release.sh)"
        )
    url, meta = take_savepoint(str(FIXTURES / fx["name"]), str(tmp_path / "sp"))
    plan = restore(url, str(tmp_path / "ck"), backend=backend, partitions=partitions)
    assert not plan.problems and plan.backend == backend
    confs = {k: v for k, v in fx["confs"].items() if k not in STORAGE_CONFS}
    ckpt = tmp_path / "ck"
    if fx["name"] in SPARK43_REFUSES:
        with pytest.raises(Exception, match=SPARK43_REFUSES[fx["name"]]):
            continue_restored(spark, fx, meta, ckpt, confs)
        # With --query, the restore writes the schema 4.3 plans (the same bytes), and 4.3
        # continues.
        ckpt = tmp_path / "ck-query"
        restore_with_query(
            fx, meta, url, ckpt, tmp_path, spark, backend=backend, partitions=partitions
        )
    continued = continue_restored(spark, fx, meta, ckpt, {**confs, CHECKSUM_CONF: "true"})
    assert continued and all(b > meta.batch_id for b in continued)
    rows = sorted((r for part in continued.values() for r in part), key=repr)
    # A limit reached before the savepoint emits nothing more; without its restored count it
    # would emit the limit again.
    assert rows or fx["query"] == "limit"
    assert rows == uninterrupted(spark, tmp_path_factory, fx)
    restored = Checkpoint.open(str(ckpt))
    last = restored.latest_committed_batch
    assert last == max(continued)
    assert restored.backend(last) == backend and restored.num_partitions(last) == partitions


def _query(fx: dict[str, Any], meta, tmp_path: Path, spark) -> dict[str, Any]:
    """``restore``'s ``query=`` arguments for the fixture's own query (fixtures/generate.py)
    over the input directory it recorded."""
    module = tmp_path / "release_query.py"
    module.write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('g', {str(ROOT / 'fixtures/generate.py')!r})\n"
        "g = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(g)\n\n\n"
        "def query(spark):\n"
        f"    return g.QUERIES[{fx['query']!r}](spark, {str(_recorded_input(meta))!r})[0]\n"
    )
    mode = generate.QUERIES[fx["query"]](spark, str(_recorded_input(meta)))[1]
    return {"query": f"{module}:query", "output_mode": mode, "spark": spark}


def restore_with_query(
    fx: dict[str, Any], meta, url: str, ckpt: Path, tmp_path: Path, spark, **kw: Any
):
    """``restore --query`` with the fixture's own query, planned over the input directory its
    file source recorded (held while planning reads it)."""
    with _recorded_dir(_recorded_input(meta)):
        plan = restore(url, str(ckpt), **kw, **_query(fx, meta, tmp_path, spark))
    assert not plan.problems, plan.problems
    return plan


V2_SOURCES = [fx for fx in RELEASE_FIXTURES if fx.get("checkpointFormatVersion") == 2]


@pytest.mark.spark
@pytest.mark.parametrize(
    "fx",
    [f for f in V2_SOURCES if f["name"] == "spark41-agg-ckptv2-rocksdb"],
    ids=lambda f: f["name"],
)
def test_spark43_verifies_the_checksums_a_restore_writes(spark, tmp_path, fx):
    """Negative control for the continuation above: Spark 4.3 does verify the ``.crc`` files
    a checkpoint-format-v2 restore writes, so a continuation that passes read correct ones.
    A restored checkpoint whose zip checksums are wrong is refused by Spark."""
    url, meta = take_savepoint(str(FIXTURES / fx["name"]), str(tmp_path / "sp"))
    plan = restore(url, str(tmp_path / "ck"), backend="rocksdb", partitions=3)
    assert not plan.problems and plan.checkpoint_format == 2
    sidecars = spark_json_checksums(tmp_path / "ck" / "state")
    assert sidecars
    for crc in sidecars:
        obj = json.loads(crc.read_text())
        obj["value"] = obj["value"] ^ 1
        crc.write_text(json.dumps(obj))
    confs = {k: v for k, v in fx["confs"].items() if k not in STORAGE_CONFS}
    with pytest.raises(Exception, match="CHECKSUM"):
        continue_restored(spark, fx, meta, tmp_path / "ck", {**confs, CHECKSUM_CONF: "true"})


def test_spark41_checksums_of_checkpoint_v1_files_are_verified(fixture_copy):
    """Spark 4.1 writes a JSON ``<file>.crc`` beside every delta (not only under checkpoint
    format v2, as 4.2 and 4.3 do): statectl checks them, a wrong one is damage."""
    from statectl.errors import CorruptFileError
    from statectl.state import Selection

    ck = fixture_copy("spark41-agg-hdfs")
    crc = ck / "state/0/1/4.delta.crc"
    obj = json.loads(crc.read_text())
    assert obj["algorithm"] == "CRC32C"
    assert read_state(Checkpoint.open(str(ck)), Selection(0)).num_rows == 7
    obj["value"] ^= 1
    crc.write_text(json.dumps(obj))
    (crc.parent / f".{crc.name}.crc").unlink()  # its Hadoop sidecar would catch it first
    with pytest.raises(
        CorruptFileError, match=r"4\.delta: does not match its checksum 4\.delta\.crc"
    ):
        read_state(Checkpoint.open(str(ck)), Selection(0))


def test_each_line_writes_the_kinds_it_supports_and_says_why_not():
    """Every fixture a release line is listed for is in the manifest; what a line cannot write
    (join format 3 before 4.1, format 4 before 4.2) is not listed, with the reason."""
    # Pending ones too (Spark 3.5's session windows: restored with --query only).
    names = {fx["name"] for fx in load_manifest(include_pending=True)}
    for release, want in generate.RELEASE_FIXTURES.items():
        prefix = generate.release_prefix(release)
        assert {prefix + n for n in want} <= names, release
        for name, why in generate.RELEASE_REFUSES.get(release, {}).items():
            assert name not in want and prefix + name not in names and why
    assert "join3-rocksdb" in generate.RELEASE_REFUSES["4.0"]
    assert "join4-rocksdb" in generate.RELEASE_REFUSES["4.1"]


@pytest.mark.spark
def test_spark35_left_semi_join_continues_on_spark43_at_join_format_4(
    spark, tmp_path, tmp_path_factory
):
    """Spark 3.5's left semi join (no operator name; stored non-nullable, planned nullable by
    4.3, see ``SPARK43_REFUSES``) restored with ``--query`` at join state format 4 continues
    on 4.3: the column families take 4.3's schema, the operator gets its name, and the
    checkpoint pins merge operator 2 (4.3 refuses format 4 with the 1 it assumes when none is
    pinned)."""
    fx = next(f for f in RELEASE_FIXTURES if f["name"] == "spark35-join-leftsemi-hdfs")
    url, meta = take_savepoint(str(FIXTURES / fx["name"]), str(tmp_path / "sp"))
    ckpt = tmp_path / "ck"
    restore_with_query(
        fx, meta, url, ckpt, tmp_path, spark, backend="rocksdb", partitions=3, join_state_format=4
    )
    confs = {k: v for k, v in fx["confs"].items() if k not in STORAGE_CONFS}
    continued = continue_restored(spark, fx, meta, ckpt, {**confs, CHECKSUM_CONF: "true"})
    rows = sorted((r for part in continued.values() for r in part), key=repr)
    assert rows and rows == uninterrupted(spark, tmp_path_factory, fx)


SPARK35_SESSIONS = [
    fx for fx in load_manifest(include_pending=True) if fx["name"].startswith("spark35-session-")
]


@pytest.mark.spark
@pytest.mark.parametrize("fx", SPARK35_SESSIONS, ids=lambda fx: fx["name"])
def test_spark35_session_window_restores_with_query_and_continues(
    spark, tmp_path, tmp_path_factory, fx
):
    """Spark 3.5 recorded no operator metadata, so nothing in its session window checkpoint
    confirms the kind: a plain restore refuses it at plan time. With ``--query`` the 4.3 plan
    names the operator (sessionWindowStateStoreSaveExec, prefix key = the grouping columns),
    the state is placed by the grouping key on the other backend at 3 partitions, and 4.3
    continues with the output of an uninterrupted 4.3 run."""
    backend, partitions = restore_target(fx)
    url, meta = take_savepoint(str(FIXTURES / fx["name"]), str(tmp_path / "sp"))
    refused = restore(
        url, str(tmp_path / "refused"), backend=backend, partitions=partitions, dry_run=True
    )
    assert any("operator metadata" in p for p in refused.problems), refused.problems
    ckpt = tmp_path / "ck"
    restore_with_query(fx, meta, url, ckpt, tmp_path, spark, backend=backend, partitions=partitions)
    restored = Checkpoint.open(str(ckpt))
    assert restored.operator(0, meta.batch_id).name == "sessionWindowStateStoreSaveExec"
    confs = {k: v for k, v in fx["confs"].items() if k not in STORAGE_CONFS}
    continued = continue_restored(spark, fx, meta, ckpt, confs)
    rows = sorted((r for part in continued.values() for r in part), key=repr)
    assert rows and rows == uninterrupted(spark, tmp_path_factory, fx)
