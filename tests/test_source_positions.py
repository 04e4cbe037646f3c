"""Source positions on restore, without Spark: the savepoint's sources matched to a changed
query's (planned sources stand in for what planning returns), the offset log and source logs
written for them, and what is refused."""

from __future__ import annotations

import dataclasses
import re

import pytest

from statectl.checkpoint.model import Checkpoint
from statectl.errors import StatectlError
from statectl.query_plan import PlannedQuery, PlannedSource
from statectl.restoration import RestoreOptions, plan_restore, write_restore
from statectl.savepoints.create import take_savepoint
from statectl.savepoints.store import Savepoint
from statectl.sources import parse_source_offsets
from tests.helpers.fixtures import FIXTURES

OLD_DIR = "/tmp/statectl-fixture-input-59qe8g3n/agg-hdfs"  # where the fixture's files were


@pytest.fixture(scope="module")
def sp(tmp_path_factory):
    url, _ = take_savepoint(str(FIXTURES / "agg-hdfs"), str(tmp_path_factory.mktemp("s") / "sp"))
    return Savepoint.open(url)


def kafka(index: int) -> PlannedSource:
    """A non-file source whose parser accepts only {"t": {...}} offsets."""
    return PlannedSource(
        index, "kafka", None, lambda text: None if text.startswith('{"t"') else "no topic"
    )


def query(sources: list[PlannedSource]) -> PlannedQuery:
    ckpt = Checkpoint.open(str(FIXTURES / "agg-hdfs"))
    return PlannedQuery("q.py:f", "update", ckpt.operators(ckpt.resolve_batch(None)), [], sources)


def plan(sp, tmp_path, sources=None, given=None, n=False):
    return plan_restore(
        sp,
        str(tmp_path / "ck"),
        RestoreOptions(allow_non_restored=n, source_offsets=given or {}),
        query=query(sources) if sources is not None else None,
    )


def offsets_written(tmp_path, batch=3) -> list[str]:
    return (tmp_path / "ck" / "offsets" / str(batch)).read_text().split("\n")[2:]


def test_unchanged_sources_are_kept_as_they_were(sp, tmp_path):
    p = plan(sp, tmp_path)
    assert not p.problems
    assert p.sources == [
        {
            "index": 0,
            "description": f"FileSource[{OLD_DIR}]",
            "position": "kept",
            "offset": '{"logOffset":3}',
        }
    ]
    write_restore(p)
    assert offsets_written(tmp_path) == ['{"logOffset":3}']
    assert offsets_written(tmp_path, 2) == ['{"logOffset":2}']
    assert (tmp_path / "ck" / "sources" / "0" / "3").exists()


def test_a_file_source_gets_no_offset_but_can_restart_from_its_files(sp, tmp_path):
    p = plan(sp, tmp_path, given={"0": '{"logOffset":1}'})
    assert len(p.problems) == 1 and "file source" in p.problems[0] and "0=-" in p.problems[0]
    p = plan(sp, tmp_path, given={"0": "-"})
    assert not p.problems and p.sources[0]["position"] == "new"
    write_restore(p)
    assert offsets_written(tmp_path) == ["-"] and not (tmp_path / "ck" / "sources").exists()


def test_a_removed_source_needs_n_and_an_added_one_starts_from_its_start(sp, tmp_path):
    p = plan(sp, tmp_path, [kafka(0)])
    assert any(f"FileSource[{OLD_DIR}]" in x and "-n" in x for x in p.problems), p.problems
    p = plan(sp, tmp_path, [kafka(0)], n=True)
    assert not p.problems
    assert [(s["description"], s["position"]) for s in p.sources] == [
        ("kafka", "new"),
        (f"FileSource[{OLD_DIR}]", "dropped"),
    ]
    write_restore(p)
    assert offsets_written(tmp_path) == ["-"] and not (tmp_path / "ck" / "sources").exists()


def test_a_replaced_source_starts_at_the_given_offset(sp, tmp_path):
    p = plan(sp, tmp_path, [kafka(0)], given={"kafka": '{"x":1}'})
    assert any("cannot parse this offset: no topic" in x for x in p.problems), p.problems
    p = plan(sp, tmp_path, [kafka(0)], given={"nope": '{"t":{}}'})
    assert any("nope: matches no source" in x and "0 kafka" in x for x in p.problems)
    p = plan(sp, tmp_path, [kafka(0)], given={"kafka": '{"t":{"0":42}}'})
    assert not p.problems, p.problems
    assert p.sources[0]["position"] == "given"
    assert p.sources[0]["replaces"] == f"FileSource[{OLD_DIR}]"
    write_restore(p)
    assert offsets_written(tmp_path) == ['{"t":{"0":42}}']


def test_a_file_source_keeps_its_log_at_its_new_index(sp, tmp_path):
    moved = PlannedSource(1, f"FileSource[{OLD_DIR}]", OLD_DIR)
    p = plan(sp, tmp_path, [kafka(0), moved])
    assert not p.problems, p.problems
    assert [(s["position"], s.get("from")) for s in p.sources] == [("new", None), ("kept", 0)]
    write_restore(p)
    assert offsets_written(tmp_path) == ["-", '{"logOffset":3}']
    assert (tmp_path / "ck" / "sources" / "1" / "3").exists()
    assert not (tmp_path / "ck" / "sources" / "0").exists()


def test_a_non_file_source_whose_offset_the_new_source_cannot_read_is_not_kept(sp, tmp_path):
    p = plan(sp, tmp_path, [kafka(0)], given={"0": '{"t":{"0":1}}'}, n=True)
    assert not p.problems
    # the same position handed to a source of another kind is refused by its parser
    sp2 = plan(sp, tmp_path, [kafka(0)], given={"0": '{"logOffset":3}'})
    assert any("cannot parse" in x for x in sp2.problems)


@pytest.mark.parametrize("pair", ["0", "=1", '0={"a":', "0=1\x00"])
def test_source_offsets_option_is_checked(pair):
    with pytest.raises(StatectlError, match="--source-offsets"):
        parse_source_offsets([pair])
    assert parse_source_offsets(['kafka={"t": {"0": 1}}', "1=-"]) == {
        "kafka": '{"t": {"0": 1}}',
        "1": "-",
    }


def test_with_offsets_resets_a_file_source_and_refuses_what_it_cannot_set(sp, tmp_path):
    import statectl

    writer = statectl.SavepointWriter.from_savepoint(sp.url())
    with pytest.raises(StatectlError, match="file source"):
        writer.with_offsets({0: '{"logOffset":1}'})
    with pytest.raises(StatectlError, match="'7' is not a source"):
        writer.with_offsets({7: None})
    with pytest.raises(StatectlError, match="is not JSON"):
        writer.with_offsets({0: "{oops"})
    reset = writer.with_offsets({0: None}).write(tmp_path / "reset")
    meta = Savepoint.open(reset.path).metadata
    assert meta.offsets == {"0": None} and meta.previous_offsets == {"0": None}
    assert meta.source_logs == {}
    assert sp.metadata.offsets == {"0": '{"logOffset":3}'}  # the base is untouched
    p = plan_restore(Savepoint.open(reset.path), str(tmp_path / "ck"), RestoreOptions())
    assert not p.problems and p.sources[0]["position"] == "new"
    write_restore(p)
    assert offsets_written(tmp_path) == ["-"] and not (tmp_path / "ck" / "sources").exists()


def test_a_file_source_in_another_directory_is_kept_by_index_and_noted(sp, tmp_path):
    p = plan(sp, tmp_path, [PlannedSource(0, "FileSource[/data/moved]", "/data/moved")])
    assert not p.problems, p.problems
    [src] = p.sources
    assert src["position"] == "kept" and OLD_DIR in src["note"] and "0=-" in src["note"]
    p = plan(sp, tmp_path, [PlannedSource(0, "FileSource[/data/moved]", "/data/moved")], {"0": "-"})
    assert not p.problems and p.sources[0]["position"] == "new"


@pytest.fixture(scope="module")
def named_sp(tmp_path_factory):
    """Offset log v2: one file source named ``events`` (Spark 4.2.1, ``readStream.name``)."""
    ck = FIXTURES / "spark42-agg-logv2-ckptv2-rocksdb"
    url, _ = take_savepoint(str(ck), str(tmp_path_factory.mktemp("n") / "sp"))
    return Savepoint.open(url)


def named_plan(sp, tmp_path, sources, given=None, n=False):
    ckpt = Checkpoint.open(str(FIXTURES / "spark42-agg-logv2-ckptv2-rocksdb"))
    q = PlannedQuery("q.py:f", "update", ckpt.operators(ckpt.resolve_batch(None)), [], sources)
    return plan_restore(
        sp,
        str(tmp_path / "ck"),
        RestoreOptions(allow_non_restored=n, source_offsets=given or {}),
        query=q,
    )


def events(index: int, name: str | None = "events") -> PlannedSource:
    return PlannedSource(index, "FileSource[/elsewhere]", "/elsewhere", name=name)


def test_named_sources_match_by_name_whatever_their_plan_position(named_sp, tmp_path):
    p = named_plan(named_sp, tmp_path, [PlannedSource(0, "kafka", None, name="k"), events(1)])
    assert not p.problems
    assert [(s["index"], s["position"]) for s in p.sources] == [("k", "new"), ("events", "kept")]
    write_restore(p)
    batch = named_sp.metadata.batch_id
    # Spark's own way for a name it has not seen yet: no line; it starts from its start.
    assert offsets_written(tmp_path, batch) == ['events:{"logOffset":3}']
    assert sorted(x.name for x in (tmp_path / "ck" / "sources").iterdir()) == ["events"]


def test_named_source_offsets_and_drops(named_sp, tmp_path):
    k = dataclasses.replace(kafka(0), name="k")
    # Dropping "events" needs -n; an offset for a new name is checked with its parser.
    p = named_plan(named_sp, tmp_path, [k], given={"k": '{"x":1}'})
    assert any("'events'" in m and "-n" in m for m in p.problems), p.problems
    assert any("k cannot parse" in m or "cannot parse this offset" in m for m in p.problems)
    p = named_plan(named_sp, tmp_path, [k], given={"k": '{"t":{"0":5}}'}, n=True)
    assert not p.problems, p.problems
    write_restore(p)
    assert offsets_written(tmp_path, named_sp.metadata.batch_id) == ['k:{"t":{"0":5}}']
    assert not (tmp_path / "ck" / "sources").exists()


@pytest.mark.parametrize(
    ("sources", "given", "why"),
    [
        ([events(0, None)], None, r"source 0 .* has no name; .* readStream.name"),
        ([events(0), events(1)], None, "names two sources 'events'"),
        ([kafka(0)], None, "has no name"),
        ([events(0)], {"nope": "-"}, "--source-offsets nope: the query has no source"),
        ([events(0)], {"events": '{"logOffset":1}'}, "is a file source, whose position"),
    ],
)
def test_named_sources_refusals(named_sp, tmp_path, sources, given, why):
    p = named_plan(named_sp, tmp_path, sources, given=given)
    assert any(re.search(why, m) for m in p.problems), p.problems


def test_a_named_source_of_another_kind_is_not_kept(named_sp, tmp_path):
    # the savepoint's file source's name, now on a Kafka-like source
    k = dataclasses.replace(kafka(0), name="events")
    p = named_plan(named_sp, tmp_path, [k])
    assert any("is not the savepoint's source of that name" in m for m in p.problems)


def test_unnamed_savepoint_into_a_query_naming_its_sources_is_refused(sp, tmp_path):
    """Spark 4.3 refuses to turn on source evolution for a checkpoint of offset log v1
    (CANNOT_ENABLE_ON_EXISTING_CHECKPOINT), and statectl does not convert it: refused, with
    the reason, whatever the kind (a file source of the same directory, a Kafka source)."""
    for source in (
        PlannedSource(0, f"FileSource[{OLD_DIR}]", OLD_DIR, name="events"),
        dataclasses.replace(kafka(0), name="k"),
    ):
        p = plan(sp, tmp_path, [source], {"0": "-"})
        assert any("CANNOT_ENABLE_ON_EXISTING_CHECKPOINT" in m for m in p.problems), p.problems
    assert not plan(sp, tmp_path, [PlannedSource(0, f"FileSource[{OLD_DIR}]", OLD_DIR)]).problems


def test_a_named_source_dropped_by_name_without_a_query(named_sp, tmp_path):
    opts = {"source_offsets": {"events": "drop"}}
    p = plan_restore(named_sp, str(tmp_path / "ck"), RestoreOptions(**opts))
    assert any("'events'" in m and "-n" in m for m in p.problems), p.problems
    p = plan_restore(
        named_sp, str(tmp_path / "ck"), RestoreOptions(allow_non_restored=True, **opts)
    )
    assert not p.problems and [s["position"] for s in p.sources] == ["dropped"]
    write_restore(p)
    assert offsets_written(tmp_path, named_sp.metadata.batch_id) == []
    assert not (tmp_path / "ck" / "sources").exists()


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ({"0": 'delta:{"sourceVersion":1,"reservoirId":"x","reservoirVersion":1,"index":-1}'},
         "the query's source is a Kafka source, not Delta Lake"),
        ({"0": "drop"}, "with --query the query says which sources it reads"),
        ({"0": 'kafka:{"t":{"0":-1}}'}, r"t/0: -1 \(latest\)"),
    ],
)  # fmt: skip
def test_swaps_and_drops_the_query_contradicts_are_refused(sp, tmp_path, given, why):
    p = plan(sp, tmp_path, [kafka(0)], given, n=True)
    assert any(re.search(why, m) for m in p.problems), p.problems


def test_source_offsets_values():
    assert parse_source_offsets(["0=drop", '1=kafka:{"t": {"0": 1}}', "2=-"]) == {
        "0": "drop",
        "1": 'kafka:{"t": {"0": 1}}',
        "2": "-",
    }
    for value, why in [
        ("opaque:{}", "does not know"),
        ("file:{}", "seen-files log"),
        ("kinesis:{}", "'kinesis' is not a source kind"),
        ("delta:{", "is not JSON"),
    ]:
        with pytest.raises(StatectlError, match=why):
            parse_source_offsets([f"0={value}"])


def test_without_a_query_a_drop_renumbers_and_names_stay_the_savepoints(tmp_path):
    """A join's two file sources: ``0=drop`` (with -n) moves source 1 to index 0 with its
    seen-files log; ``1=-`` still names the savepoint's source 1."""
    url, _ = take_savepoint(str(FIXTURES / "join-hdfs"), str(tmp_path / "sp"))
    opts = RestoreOptions(allow_non_restored=True, source_offsets={"0": "drop", "1": "-"})
    p = plan_restore(Savepoint.open(url), str(tmp_path / "ck"), opts)
    assert not p.problems, p.problems
    assert [(s["index"], s["position"]) for s in p.sources] == [(0, "new"), (None, "dropped")]
    write_restore(p)
    assert offsets_written(tmp_path) == ["-"]
