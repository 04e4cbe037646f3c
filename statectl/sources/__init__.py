"""Streaming sources: the one owner of what statectl knows about them.

* :mod:`statectl.sources.kinds`: one spec per source kind (file, Kafka, rate,
  rate-micro-batch, Delta, Python data sources, and opaque for anything else): its offset
  JSON, its ``sources/<index>/`` files, how its position is described and checked.
* :mod:`statectl.sources.carry`: a checkpoint's sources as inspect, savepoint, restore and
  migrate see them; every source's files carried exactly.
* :mod:`statectl.sources.edits`: what ``--source-offsets`` asks (an offset, a swap to
  another kind, from the start, a source dropped), checked and written as Spark writes it.
* :mod:`statectl.sources.positions`: where each source of a restored query starts.
"""

from statectl.sources.carry import (
    CheckpointSource,
    carried_paths,
    checkpoint_sources,
    copy_carried_sources,
    file_source_logs,
    native_source_files,
    position_text,
    savepoint_source_rows,
    savepoint_sources,
    write_carried_sources,
)
from statectl.sources.edits import DROP, START, normalize_offset, parse_source_offsets
from statectl.sources.kinds import KINDS, OPAQUE, SourceKind, kind_named, recognise
from statectl.sources.positions import SourcePositions, plan_positions

__all__ = [
    "DROP",
    "KINDS",
    "OPAQUE",
    "START",
    "CheckpointSource",
    "SourceKind",
    "SourcePositions",
    "carried_paths",
    "checkpoint_sources",
    "copy_carried_sources",
    "file_source_logs",
    "kind_named",
    "native_source_files",
    "normalize_offset",
    "parse_source_offsets",
    "plan_positions",
    "position_text",
    "recognise",
    "savepoint_source_rows",
    "savepoint_sources",
    "write_carried_sources",
]
