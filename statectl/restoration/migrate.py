"""Use case ``migrate``: a savepoint of a checkpoint restored in one step. The target is
marked in progress first and the temporary savepoint is written inside it (``.statectl-tmp/``)
and removed before the target is finished, so an interrupted migrate leaves one directory
that says what it is (and that ``--overwrite`` replaces), never a full savepoint elsewhere.

Operators whose bytes stay the same (statectl/passthrough.py) skip the typed savepoint: their
stores go from the source's files to the target's, only the keys decoded for placement
(``plan.passthrough`` names them)."""

from __future__ import annotations

import posixpath
from typing import Any

from statectl.checkpoint.model import Checkpoint, Operator
from statectl.errors import MissingFileError, StatectlError
from statectl.io import FileIO
from statectl.passthrough import fallback_reason
from statectl.restoration import continuation
from statectl.restoration.options import MigrateOptions
from statectl.restoration.plan import RestorePlan
from statectl.restoration.planning import plan_restore
from statectl.restoration.targets import begin_target, target_problems, under
from statectl.restoration.write import write_restore
from statectl.savepoints.create import take_savepoint
from statectl.savepoints.store import Savepoint
from statectl.spark_engine import engine_for

# Where migrate keeps its temporary savepoint: inside the target, removed before it completes.
TMP_DIR = ".statectl-tmp"


class _Target:
    """The target of a migrate: its filesystem and root, and whether it existed before."""

    def __init__(self, url: str, source_io: FileIO, source_root: str, overwrite: bool) -> None:
        self.url = url
        self.io, self.root = FileIO.for_url(url)
        self.source = source_io.url(source_root)
        self.overwrite = overwrite
        self.existed = self.io.exists(self.root)

    @property
    def tmp(self) -> str:
        return under(self.root, TMP_DIR)

    def begin(self) -> None:
        begin_target(
            self.io, self.root, self.overwrite, "migrate", self.source, self.io.url(self.root)
        )

    def discard(self) -> None:
        """The target as migrate found it: absent, or an empty directory."""
        self.io.remove(self.root, recursive=True)
        if self.existed:
            self.io.makedirs(self.root)

    def drop_tmp(self) -> None:
        if self.io.exists(self.tmp):
            self.io.remove(self.tmp, recursive=True)


def _check(options: MigrateOptions, target: _Target, src_io: FileIO, src_root: str) -> None:
    problems, _ = target_problems(
        target.io, target.root, options.overwrite, [("source checkpoint", src_io, src_root)]
    )
    if problems:
        raise StatectlError(problems[0])
    if options.partitions is not None and options.partitions < 1:
        raise StatectlError(f"--partitions must be at least 1, got {options.partitions}")


def migrate(
    source: str,
    target: str,
    options: MigrateOptions | None = None,
    *,
    runner: Any = None,
    **choices: Any,
) -> tuple[RestorePlan, str | None]:
    """Savepoint then restore, as ``options`` say (or the keyword ``choices``:
    :class:`MigrateOptions`' fields); ``runner`` as :func:`statectl.restoration.restore`'s.
    Returns the plan and the kept savepoint (None unless ``options.keep_savepoint``)."""
    if options is None:
        options = MigrateOptions(**choices)
    elif choices:
        raise TypeError("pass either options or keyword choices, not both")
    engine = runner or engine_for(options.engine, memory=options.memory, workers=options.workers)
    src_io, src_root = FileIO.for_url(source)
    dst = _Target(target, src_io, src_root, options.overwrite)
    _check(options, dst, src_io, src_root)
    # The local engine only (Spark's runs the savepoint path), a checkpoint (not a native
    # savepoint), no savepoint to keep (a kept one must hold the state), no --watermark
    # (the plan counts the rows it evicts in the savepoint), no --row-checksums (new bytes).
    fast = (
        options.passthrough
        and engine.runs_locally
        and options.keep_savepoint is None
        and options.watermark is None
        and not options.row_checksums
        and src_io.exists(posixpath.join(src_root, "offsets"))
    )
    try:
        dst.begin()
        plan, kept = _plan_and_write(source, dst, options, engine, fast)
    finally:
        # On every exit path (errors, Ctrl-C, SIGTERM): no temporary savepoint survives.
        dst.drop_tmp()
    return plan, kept if options.keep_savepoint else None


def _plan_and_write(
    source: str, dst: _Target, options: MigrateOptions, engine: Any, fast: bool
) -> tuple[RestorePlan, str]:
    try:
        plan, kept = _migrate_plan(source, dst, options, engine, fast)
    except StatectlError:
        # Refused before any state was written: leave the target as it was found.
        dst.discard()
        raise
    try:
        write_restore(plan, before_finish=dst.drop_tmp)
    except StatectlError as e:
        if not plan.passthrough:
            raise
        # The pass-through reads the source while it writes. A source the savepoint path
        # refuses before writing anything leaves the target as it was found, as there.
        dst.discard()
        if not isinstance(e, MissingFileError) or options.batch is not None:
            raise
        # Spark's maintenance removed a file of the batch meanwhile (a running query):
        # the savepoint path tries the newest batch again.
        dst.begin()
        plan, kept = _migrate_plan(source, dst, options, engine, False)
        write_restore(plan, before_finish=dst.drop_tmp)
    return plan, kept


def _migrate_plan(
    source: str, dst: _Target, options: MigrateOptions, engine: Any, fast: bool
) -> tuple[RestorePlan, str]:
    """The temporary savepoint (``fast``: operators that pass through unread) and the plan
    of the restore from it."""
    chosen: dict[int, tuple[Any, int, Operator]] = {}
    join_format, state_formats = options.join_state_format, options.state_formats

    def unread(ckpt: Any, b: int, op: Operator) -> bool:
        if fallback_reason(ckpt, b, op, join_format, state_formats) is not None:
            return False
        chosen[op.operator_id] = (ckpt, b, op)
        return True

    dst.drop_tmp()
    kept, meta = take_savepoint(
        source,
        options.keep_savepoint or dst.io.url(dst.tmp),
        batch=options.batch,
        verify=options.verify,
        engine=engine,
        unread=unread if fast else None,
    )
    plan = plan_restore(Savepoint.open(kept), dst.url, options.restore_options(), own_target=True)
    plan.engine = engine
    continuation.plan_changelog(plan, Checkpoint.open(source), meta.batch_id)
    if plan.problems:
        raise StatectlError(f"cannot migrate: {plan.problems[0]}", dst.io.url(dst.root))
    for op in meta.operators:
        raw = chosen.get(op.operator_id)
        if raw is None or raw[1] != meta.batch_id:
            continue
        # ``fallback_reason`` is the one decider: migrate plans no query or transform, and a
        # join whose state format is converted never passes through, so the plan restores
        # these stores as they are. A plan that says otherwise is a bug, not a second path.
        if op.uid not in plan.restored or plan.rewrites(op.uid):
            raise StatectlError(
                f"internal error: operator {op.uid} was read as passing through unchanged but "
                "the plan changes it; rerun with --keep-savepoint to take the savepoint path",
                dst.io.url(dst.root),
            )
        plan.passthrough[op.uid] = raw
    return plan, kept
