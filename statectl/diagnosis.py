"""Use case ``doctor``: every problem Spark would hit restarting a checkpoint, found from the
files alone, the batches each store can still be rebuilt at, the last batch every operator can
be read at, and the command that recovers from it.

Nothing here has its own idea of health: a store's version is rebuildable when the backend finds
the files that load it (``Backend.missing_files``, what ``list`` checks, and
``Backend.copy_files``, the files a copy of it needs, SSTs included), when every one of them
passes :mod:`statectl.checksums`, and, at the batch doctor recommends, when the one read path
(``statectl.state.load_raw``) loads it. The logs are read through the checkpoint model.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from statectl.checkpoint.model import Checkpoint, Operator, partition_absent, store_dir
from statectl.checksums import read_verified
from statectl.errors import StatectlError
from statectl.in_progress import describe_in_progress, read_in_progress
from statectl.io import FileIO
from statectl.state import StoreEncoding, load_raw, store_unique_id

# Exit codes of `statectl doctor` (docs/guide.md, Errors): unreadable is every command's 2.
HEALTHY, PROBLEMS = 0, 1
# Temporary files of an atomic write that never finished: Spark's CheckpointFileManager and
# statectl's FileIO both write ".<name>.<uuid>.tmp" and rename it.
_TEMP = re.compile(r"^\..+\.tmp$")
_MIGRATE_TMP = ".statectl-tmp"


@dataclass
class Problem:
    """One thing Spark (or a restore of a batch) would trip over; ``blocking``: Spark cannot
    restart the query as it is."""

    kind: str  # state, log, metadata, leftover, operator
    message: str
    blocking: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "blocking": self.blocking}


@dataclass
class StoreReport:
    """One store of one partition of one operator: the batches its state can be rebuilt at."""

    operator: int
    partition: int
    store: str
    rebuildable: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    why: dict[int, str] = field(default_factory=dict)  # batch -> why it cannot be rebuilt

    def to_dict(self) -> dict[str, Any]:
        return {
            "operator": self.operator,
            "partition": self.partition,
            "store": self.store,
            "rebuildable_batches": spans(self.rebuildable),
            "problems": self.problems,
        }


@dataclass
class Diagnosis:
    """What ``doctor`` found (``to_dict`` is ``--json``)."""

    path: str
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stores: list[StoreReport] = field(default_factory=list)
    latest_committed_batch: int | None = None
    last_recoverable_batch: int | None = None
    lost_batches: list[int] = field(default_factory=list)
    source_offsets: dict[str, Any] | None = None
    recovery: list[str] = field(default_factory=list)
    orphan_checksums: list[str] = field(default_factory=list)
    newest_commit: int = -1  # commits/N with the highest N, usable or not

    @property
    def exit_code(self) -> int:
        return PROBLEMS if self.problems else HEALTHY

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "healthy": not self.problems,
            "exit_code": self.exit_code,
            "problems": [p.to_dict() for p in self.problems],
            "notes": self.notes,
            "latest_committed_batch": self.latest_committed_batch,
            "last_recoverable_batch": self.last_recoverable_batch,
            "lost_batches": spans(self.lost_batches),
            "source_offsets_at_last_recoverable": self.source_offsets,
            "recovery": self.recovery,
            "stores": [s.to_dict() for s in self.stores],
        }


def spans(ids: list[int]) -> str:
    """Batch ids as ranges: ``0-3,5``; empty for none."""
    out: list[str] = []
    for b in sorted(ids):
        if out and out[-1].split("-")[-1] == str(b - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{b}"
        else:
            out.append(str(b))
    return ",".join(out)


def diagnose(url: str) -> Diagnosis:
    """``statectl doctor``: see the module docstring. Raises a StatectlError only when ``url``
    is no checkpoint at all (exit code 2)."""
    io, root = FileIO.for_url(url)
    diag = Diagnosis(io.url(root))
    marker = read_in_progress(io, root)
    if marker is not None:
        diag.problems.append(
            Problem("leftover", f"{describe_in_progress(marker)}: not a checkpoint yet", True)
        )
        diag.recovery.append(_rerun_command(marker))
        return diag
    ckpt = Checkpoint(io, root)
    _check_metadata(ckpt, diag)
    _check_leftovers(ckpt, diag)
    batches = _check_logs(ckpt, diag)
    _check_state(ckpt, batches, diag)
    _conclude(ckpt, batches, diag)
    return diag


def _rerun_command(marker: dict[str, Any]) -> str:
    """The command that replaces an interrupted restore or migrate (its marker says which)."""
    source, target = marker.get("source"), marker.get("target")
    if not source or not target:
        return "re-run the interrupted statectl restore or migrate with --overwrite"
    if marker.get("command") == "migrate":
        return shlex.join(["statectl", "migrate", source, target, "--overwrite"])
    return shlex.join(["statectl", "restore", "-s", source, target, "--overwrite"])


def _check_metadata(ckpt: Checkpoint, diag: Diagnosis) -> None:
    """``metadata`` holds the query id Spark reads first when the query starts."""
    p = ckpt.path("metadata")
    if not ckpt.io.exists(p):
        diag.problems.append(
            Problem(
                "metadata",
                f"{p}: missing: Spark would start the query under a new query id (sinks that "
                "deduplicate by query id and batch would not recognise it)",
            )
        )
        return
    try:
        ckpt.query_id  # noqa: B018 - parsing is the check
    except StatectlError as e:
        diag.problems.append(Problem("metadata", f"{e}: Spark cannot start the query", True))


def _check_leftovers(ckpt: Checkpoint, diag: Diagnosis) -> None:
    """Temporary files of writes that never finished (Spark's, statectl's) and migrate's
    temporary savepoint: harmless to Spark, but nobody removes them."""
    found = [
        f.path
        for f in ckpt.io.walk_files(ckpt.root)
        if _TEMP.match(f.name) or f"/{_MIGRATE_TMP}/" in f.path
    ]
    for p in sorted(found):
        diag.problems.append(
            Problem(
                "leftover",
                f"{p}: temporary file of an unfinished write; delete it when no query or "
                "statectl is writing this checkpoint",
            )
        )


def _check_logs(ckpt: Checkpoint, diag: Diagnosis) -> list[int]:
    """Problems in ``offsets/`` and ``commits/``; returns the batches whose offsets and commit
    both parse (the batches a restart or ``--batch`` can use), ascending."""
    offsets, commits = _listed(ckpt, "offsets", diag), _listed(ckpt, "commits", diag)
    usable = [b for b in sorted(set(offsets) & set(commits)) if _parses(ckpt, b, diag)]
    diag.newest_commit = commits[-1] if commits else -1
    _log_shape_problems(ckpt, offsets, commits, diag)
    if usable:
        diag.latest_committed_batch = usable[-1]
        restart = usable[-1]
        if restart > 0 and restart - 1 not in offsets:
            diag.problems.append(
                Problem(
                    "log",
                    f"{ckpt.path('offsets', str(restart - 1))}: missing: Spark needs the offsets "
                    f"of batch {restart - 1} to restart after batch {restart}",
                    True,
                )
            )
    elif commits or offsets:
        diag.problems.append(Problem("log", "no batch has both its offsets and its commit", True))
    return usable


def _listed(ckpt: Checkpoint, log: str, diag: Diagnosis) -> list[int]:
    """A log's batch ids; a Hadoop checksum left behind by a deleted entry is a problem (Spark
    ignores it; statectl refuses to read past it, so the recovery removes it first)."""
    names = {f.name for f in ckpt.io.list_dir(ckpt.path(log))}
    for name in sorted(names):
        entry = name[1:-4] if name.startswith(".") and name.endswith(".crc") else ""
        if entry.isdigit() and entry not in names:
            crc = ckpt.path(log, name)
            diag.problems.append(
                Problem("log", f"{ckpt.path(log, entry)}: deleted (its checksum {name} is left)")
            )
            diag.orphan_checksums.append(crc)
    return sorted(int(n) for n in names if n.isdigit())


def _parses(ckpt: Checkpoint, batch: int, diag: Diagnosis) -> bool:
    try:
        ckpt.offsets(batch)
        ckpt.commit(batch)
    except StatectlError as e:
        diag.problems.append(Problem("log", str(e)))
        return False
    return True


def _log_shape_problems(
    ckpt: Checkpoint, offsets: list[int], commits: list[int], diag: Diagnosis
) -> None:
    """Gaps, commits without offsets, and offsets without a commit (but the newest batch's,
    which is a batch Spark re-runs)."""
    for log, ids in (("offsets", offsets), ("commits", commits)):
        have = set(ids)
        missing = [b for b in range(ids[0], ids[-1]) if b not in have] if ids else []
        if missing:
            diag.problems.append(
                Problem("log", f"{ckpt.path(log)}: gap in the log: no entry for {spans(missing)}")
            )
    orphan_commits = sorted(set(commits) - set(offsets))
    if orphan_commits:
        newest = bool(offsets) and orphan_commits[-1] > offsets[-1]
        diag.problems.append(
            Problem(
                "log",
                f"{ckpt.path('commits')}: commits without offsets: {spans(orphan_commits)}",
                newest,
            )
        )
    last_commit = commits[-1] if commits else -1
    # Entries before the oldest commit are normal: a restored checkpoint starts with the
    # offsets of the batch before its first commit, which a restart re-plans from.
    first_commit = commits[0] if commits else -1
    unfinished = sorted(b for b in set(offsets) - set(commits) if b > first_commit)
    if unfinished and unfinished[-1] > last_commit:
        diag.notes.append(f"batch {unfinished[-1]} is not committed: Spark re-runs it on restart")
        unfinished = unfinished[:-1]
    if unfinished:
        diag.problems.append(
            Problem("log", f"{ckpt.path('offsets')}: offsets without a commit: {spans(unfinished)}")
        )


# -- state ---------------------------------------------------------------------------------
class _Verified:
    """Each state file's checksum verdict, computed once (versions share their files)."""

    def __init__(self, io: FileIO) -> None:
        self.io = io
        self.seen: dict[str, str | None] = {}

    def problem(self, path: str) -> str | None:
        if path not in self.seen:
            try:
                read_verified(self.io, path, data_file=True, verify=True)
                self.seen[path] = None
            except StatectlError as e:
                self.seen[path] = str(e)
        return self.seen[path]


def _operators(ckpt: Checkpoint, batches: list[int], diag: Diagnosis) -> list[Operator]:
    """The operators as the newest usable batch describes them (None readable: a problem)."""
    try:
        ids = ckpt.operator_ids()
    except StatectlError as e:
        diag.problems.append(Problem("operator", str(e), True))
        return []
    ops = []
    for op_id in ids:
        try:
            ops.append(ckpt.operator(op_id, batches[-1]))
        except StatectlError as e:
            diag.problems.append(Problem("operator", str(e), True))
            return []
    return ops


def _check_state(ckpt: Checkpoint, batches: list[int], diag: Diagnosis) -> None:
    """Every store partition at every usable batch (names, then checksums)."""
    if not batches:
        return
    ops = _operators(ckpt, batches, diag)
    if len(ops) < len(_safe_ids(ckpt)):
        batches.clear()  # an operator that cannot be described cannot be restored
        return
    verified = _Verified(ckpt.io)
    encodings = {b: StoreEncoding.of(ckpt, b) for b in batches}
    for op in ops:
        for p in range(op.num_partitions):
            for store in op.store_names:
                report = StoreReport(op.operator_id, p, store)
                diag.stores.append(report)
                for b in batches:
                    problem = _version_problem(ckpt, op, store, p, b, encodings[b], verified)
                    if problem is None:
                        report.rebuildable.append(b)
                        continue
                    report.why[b] = problem
                    if problem not in report.problems:
                        report.problems.append(problem)


def _safe_ids(ckpt: Checkpoint) -> list[int]:
    try:
        return ckpt.operator_ids()
    except StatectlError:
        return []


def _version_problem(
    ckpt: Checkpoint,
    op: Operator,
    store: str,
    partition: int,
    batch: int,
    enc: StoreEncoding,
    verified: _Verified,
) -> str | None:
    """Why the state of ``batch`` (version batch+1) of one store partition cannot be rebuilt,
    from file names and checksums; None when it can."""
    if partition_absent(ckpt, op, partition):
        return None
    d = store_dir(ckpt, op.operator_id, partition, store)
    backend = enc.store_backend
    version = batch + 1
    try:
        opts = enc.read_options(store_unique_id(ckpt, op, store, partition, batch, enc), True)
        if opts.unique_id is None:
            missing = backend.missing_files(
                ckpt.io, d, version, column_families=op.uses_column_families
            )
            if missing:
                return missing[0]
        files = backend.copy_files(ckpt.io, d, version, opts)
    except StatectlError as e:
        return str(e)
    for f in files:
        if not f.endswith(".crc") and (problem := verified.problem(f)) is not None:
            return problem
    return None


def _loads(ckpt: Checkpoint, batch: int, diag: Diagnosis) -> bool:
    """Whether every store of every operator loads at ``batch`` through the one read path
    (a damaged file no checksum covers shows here); a failure becomes a problem."""
    enc = StoreEncoding.of(ckpt, batch)
    for op in ckpt.operators(batch):
        for p in range(op.num_partitions):
            for store in op.store_names:
                try:
                    load_raw(ckpt, op, store, p, batch, enc)
                except StatectlError as e:
                    diag.problems.append(Problem("state", str(e)))
                    _mark(diag, op.operator_id, p, store, batch, str(e))
                    return False
    return True


def _mark(diag: Diagnosis, op: int, partition: int, store: str, batch: int, why: str) -> None:
    for s in diag.stores:
        if (s.operator, s.partition, s.store) == (op, partition, store):
            s.rebuildable = [b for b in s.rebuildable if b != batch]
            s.why[batch] = why
            s.problems.append(why)


def _conclude(ckpt: Checkpoint, batches: list[int], diag: Diagnosis) -> None:
    """The last recoverable batch, what is lost after it, and the command that recovers."""
    everywhere = [b for b in batches if all(b in s.rebuildable for s in diag.stores)]
    chosen = next((b for b in reversed(everywhere) if _loads(ckpt, b, diag)), None)
    latest = diag.latest_committed_batch
    diag.last_recoverable_batch = chosen
    for s in diag.stores:
        if latest is not None and latest not in s.rebuildable:
            why = s.why.get(latest, "it does not load")
            diag.problems.append(
                Problem(
                    "state",
                    f"operator {s.operator} partition {s.partition} store {s.store!r}: the "
                    f"state of batch {latest} cannot be rebuilt: {why}",
                    True,
                )
            )
    older = [b for b in batches if b not in everywhere and (chosen is None or b < chosen)]
    if older:
        diag.notes.append(
            f"not every store can be rebuilt at logged batches {spans(older)} (Spark's "
            "maintenance removes old state files): not usable as --batch"
        )
    if chosen is None:
        if latest is not None:
            diag.problems.append(Problem("state", "no batch in the logs can be recovered", True))
        return
    diag.source_offsets = dict(ckpt.offsets(chosen).offsets)
    newest = max(latest or 0, diag.newest_commit)
    diag.lost_batches = list(range(chosen + 1, newest + 1))
    stuck = latest is not None and chosen < latest
    if stuck and not any(p.blocking and p.kind == "state" for p in diag.problems):
        diag.problems.append(Problem("state", f"the state of batch {latest} does not load", True))
    _recovery(ckpt, chosen, diag)


def _recovery(ckpt: Checkpoint, chosen: int, diag: Diagnosis) -> None:
    """What to run when Spark cannot restart as it is: a damaged ``metadata`` is replaced by
    hand (migrate reads the query id from it); everything else by a migrate of ``chosen``."""
    blocking = [p for p in diag.problems if p.blocking]
    if any(p.kind == "metadata" for p in blocking):
        diag.recovery.append(
            f"restore {ckpt.path('metadata')} from a backup, or delete it and its "
            ".metadata.crc (Spark then starts the query under a new query id)"
        )
    elif blocking:
        if diag.orphan_checksums:
            diag.recovery.append(shlex.join(["rm", "--", *diag.orphan_checksums]))
        diag.recovery.append(_migrate_command(ckpt, chosen))
        if any(p.kind == "metadata" for p in diag.problems):
            # No query id to carry: the migrated checkpoint's metadata names none, which Spark
            # does not parse; without the file Spark writes a new id when the query starts.
            target = recovered_target(ckpt.root, chosen)
            diag.recovery.append(shlex.join(["rm", "--", f"{target}/metadata"]))


def _migrate_command(ckpt: Checkpoint, batch: int) -> str:
    """``statectl migrate CKPT NEW --batch N``: a new checkpoint holding ``batch``'s state,
    logs and source positions (the damaged one is left as it is)."""
    src = ckpt.io.url(ckpt.root)
    return shlex.join(
        ["statectl", "migrate", src, recovered_target(src, batch), "--batch", str(batch)]
    )


def recovered_target(ckpt_url: str, batch: int) -> str:
    """Where :func:`diagnose`'s recovery command writes (a sibling of the checkpoint)."""
    return f"{ckpt_url.rstrip('/')}-recovered-{batch}"


def describe(diag: Diagnosis) -> list[str]:
    """``doctor`` for people: one line each."""
    lines = [f"{diag.path}: " + ("healthy" if not diag.problems else "problems found")]
    lines += [f"  problem: {p.message}" for p in diag.problems]
    lines += [f"  note: {n}" for n in diag.notes]
    damaged = [s for s in diag.stores if s.problems]
    if diag.stores:
        lines.append(
            f"  stores: {len(diag.stores) - len(damaged)} of {len(diag.stores)} rebuildable at "
            "every batch in the logs"
        )
    for s in damaged:
        lines.append(
            f"  operator {s.operator} partition {s.partition} store {s.store}: rebuildable at "
            f"batches {spans(s.rebuildable) or 'none'}"
        )
    if diag.latest_committed_batch is not None:
        lines.append(f"  latest committed batch: {diag.latest_committed_batch}")
    if diag.last_recoverable_batch is not None:
        lines.append(f"  last recoverable batch: {diag.last_recoverable_batch}")
    if diag.lost_batches:
        lines.append(
            f"  lost: batches {spans(diag.lost_batches)}, reprocessed from the sources' "
            f"positions at batch {diag.last_recoverable_batch}"
        )
    lines += [f"  recover: {c}" for c in diag.recovery]
    return lines


__all__ = ["Diagnosis", "Problem", "StoreReport", "describe", "diagnose", "recovered_target"]
