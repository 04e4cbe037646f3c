"""Starting a SparkSession for statectl's own use, quietly.

Used by ``--query`` planning and by the Spark engine. The JVM prints to its stderr before any
logging is configured (JDK notices, the launcher, log4j's start-up banner) and then logs WARN
lines and a console progress bar: a statectl command shows none of it. A log4j2 configuration at
level ``error`` goes to the driver, stderr goes to a log file while the JVM starts (named in the
error when it does not start), and a terminal gets an elapsed-time line instead.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from statectl.errors import StatectlError

QUIET_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def spark_message(e: BaseException) -> str:
    """One line of a Spark (or py4j-wrapped) error."""
    java = getattr(e, "java_exception", None)
    text = str(java.getMessage()) if java is not None else str(e)
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def _lasting_tmp() -> str:
    """Where a file named in an error goes: the temporary directory, outside the command's
    own scratch directory (``statectl-run-*``, removed when the command ends)."""
    tmp = tempfile.gettempdir()
    if os.path.basename(tmp).startswith("statectl-run-"):
        return os.path.dirname(tmp)
    return tmp


def _java_options(confs: dict[str, str], conf_dir: str) -> str:
    """The driver's Java options: the user's, then a log4j2 configuration at level error
    (written in ``conf_dir``: log4j reads it once, as the JVM starts)."""
    conf = os.path.join(conf_dir, "log4j2.properties")
    with open(conf, "w") as f:
        f.write(QUIET_LOG4J2)
    java_opts = f"-Dlog4j2.configurationFile=file:{conf}"
    if confs.get("spark.driver.extraJavaOptions"):
        java_opts = f"{confs['spark.driver.extraJavaOptions']} {java_opts}"
    return java_opts


@contextlib.contextmanager
def _stderr_to(log: Any, started: float, show_time: bool) -> Iterator[None]:
    """The process's stderr goes to ``log`` while the JVM starts; a terminal gets an
    elapsed-time line instead (when ``show_time``)."""
    sys.stderr.flush()
    terminal = os.dup(2)
    os.dup2(log.fileno(), 2)
    stop = threading.Event()

    def tick() -> None:  # an elapsed-time line on a terminal while the JVM starts
        while not stop.wait(1):
            line = f"\rstatectl: starting Spark... {time.monotonic() - started:.0f} s"
            os.write(terminal, line.encode())
        os.write(terminal, b"\r\x1b[K")

    ticker = threading.Thread(target=tick, daemon=True)
    if show_time and os.isatty(terminal):
        ticker.start()
    try:
        yield
    finally:
        stop.set()
        if ticker.is_alive():
            ticker.join()
        os.dup2(terminal, 2)
        os.close(terminal)


def quiet_session(
    app_name: str,
    confs: dict[str, str],
    *,
    purpose: str,
    progress: Callable[[str], None] | None = None,
    starting: str = "starting Spark",
) -> Any:
    """The active SparkSession, or a new one built from ``confs`` (on top of spark-defaults and
    the ``SPARK_*`` environment) without the JVM's noise. ``purpose`` prefixes the error."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if progress:
        progress(f"{starting} (the JVM takes 20-40 s to start)")
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="statectl-log4j-") as conf_dir,
        tempfile.NamedTemporaryFile(
            prefix="statectl-spark-", suffix=".log", dir=_lasting_tmp(), delete=False
        ) as log,
        _stderr_to(log, started, progress is not None),
    ):
        java_opts = _java_options(confs, conf_dir)
        try:
            builder = SparkSession.builder.appName(app_name).config(
                "spark.ui.showConsoleProgress", "false"
            )
            for key, value in confs.items():
                builder = builder.config(key, value)
            spark = builder.config("spark.driver.extraJavaOptions", java_opts).getOrCreate()
        except Exception as e:
            raise StatectlError(
                f"{purpose}: Spark did not start ({spark_message(e)}); its output is in {log.name}"
            ) from None
    os.unlink(log.name)  # started: the JVM keeps writing to the (unlinked) file, not the terminal
    spark.sparkContext.setLogLevel("ERROR")
    if progress:
        progress(f"Spark started in {time.monotonic() - started:.0f} s")
    return spark
