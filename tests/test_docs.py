"""The docs run: every ``statectl`` command in README.md and docs/guide.md, and the Python
examples of docs/api.md, against copies of the bundled fixtures.

Commands come from fenced ``bash`` blocks. Their placeholder paths are mapped onto fixture
copies, generated savepoints, fresh targets, moto's S3 server and a small query module by the
table below, one token at a time. A token that looks like a path, URL, placeholder or query
but is not in the table fails the test: the docs cannot show a command nobody runs. A command
documented to fail says so in its comment, ``(exit code N)``; every other must exit 0.
``export VAR=VALUE`` lines set the environment of the commands after them in the same block.
"""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from tests.helpers.fixtures import FIXTURES, ROOT

DOC_FILES = ("README.md", "docs/guide.md")
# Shell commands the docs show beside statectl's; shown, not run here.
OTHER_COMMANDS = {"pip install -e .", "pip install -e '.[test]'", "python -m pytest -q -n 2"}
ORDERS = "multi-hdfs"  # the docs' "orders" query: a dedupe and a count per key, two operators
ORDERS_UIDS = {0: "order-totals", 1: "dedup"}


class Sandbox:
    """A fresh directory per command (or per api.md run), with each placeholder made on use."""

    def __init__(self, tmp: pathlib.Path, request: pytest.FixtureRequest) -> None:
        self.tmp = tmp
        self.cwd = tmp / "cwd"
        self.cwd.mkdir()
        self.request = request
        self.env: dict[str, str] = {}
        self._made: dict[str, str] = {}

    def _once(self, key: str, make: Callable[[], str]) -> str:
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]

    def checkpoint(self, name: str, fixture: str) -> str:
        def copy() -> str:
            dst = self.tmp / "checkpoints" / name
            shutil.copytree(FIXTURES / fixture, dst)
            return str(dst)

        return self._once(f"ckpt:{name}", copy)

    def checkpoints(self) -> str:
        self.checkpoint("orders", ORDERS)
        self.checkpoint("clicks", "join-hdfs")
        return str(self.tmp / "checkpoints")

    def new(self, name: str) -> str:
        """A path that does not exist yet (a restore target, a missing checkpoint)."""
        return str(self.tmp / "new" / name.strip("/").replace("/", "_"))

    def savepoint(self) -> str:
        import statectl

        def take() -> str:
            orders = self.checkpoint("orders", ORDERS)
            return statectl.savepoint(orders, self.tmp / "sp", uids=ORDERS_UIDS).path

        return self._once("savepoint", take)

    def endpoint(self) -> str:
        """moto's S3 server; its credentials and endpoint go into the commands' environment."""
        endpoint = self.request.getfixturevalue("s3_endpoint")
        self.env.update(endpoint)
        return endpoint["AWS_ENDPOINT_URL"]

    def bucket(self) -> str:
        def make() -> str:
            import s3fs

            fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": self.endpoint()})
            name = f"docs-{uuid.uuid4().hex[:12]}"
            fs.mkdir(name)
            fs.put(str(FIXTURES / ORDERS), f"{name}/ckpt/orders", recursive=True)
            return name

        return self._once("bucket", make)

    def query(self, spec: str) -> str:
        jobs = self.cwd / "jobs"
        if not jobs.exists():
            jobs.mkdir()
            (jobs / "__init__.py").write_text("")
            shutil.copy(ROOT / "tests" / "docs_jobs" / "orders.py", jobs / "orders.py")
            (self.cwd / "input").mkdir()
        return spec


def kafka_savepoint(s: Sandbox) -> str:
    """A savepoint of the guide's Kafka pipeline (fixtures/sources.py's kafka-hdfs)."""
    import statectl

    def take() -> str:
        return statectl.savepoint(s.checkpoint("kafka-orders", "kafka-hdfs"), s.tmp / "ksp").path

    return s._once("kafka-savepoint", take)


# Placeholder -> what it stands for. Keep it small: a new placeholder in the docs needs a line.
PLACEHOLDERS: dict[str, Callable[[Sandbox], str]] = {
    "/checkpoints/kafka-orders": lambda s: s.checkpoint("kafka-orders", "kafka-hdfs"),
    "/savepoints/kafka-orders": kafka_savepoint,
    "/ckpt/kafka-orders-rocksdb": lambda s: s.new("kafka-orders-rocksdb"),
    "/ckpt/kafka-orders-v2": lambda s: s.new("kafka-orders-v2"),
    "fixtures/checkpoints/agg-hdfs": lambda s: s.checkpoint("agg-hdfs", "agg-hdfs"),
    "/checkpoints": lambda s: s.checkpoints(),
    "/checkpoints/orders": lambda s: s.checkpoint("orders", ORDERS),
    "/ckpt/orders": lambda s: s.checkpoint("orders", ORDERS),
    "/checkpoints/clicks": lambda s: s.checkpoint("clicks", "join-hdfs"),  # a join
    "/checkpoints/sessions": lambda s: s.checkpoint("sessions", "tws-rocksdb"),  # tws: cnt/lst/mp
    "/checkpoints/missing": lambda s: s.new("missing"),
    "/checkpoints/windows": lambda s: s.checkpoint("windows", "window-hdfs"),  # 10 s windows
    "/savepoints/windows-recent": lambda s: s.new("windows-recent"),
    "/checkpoints/orders-rocksdb": lambda s: s.new("orders-rocksdb"),
    "/ckpt/orders-rocksdb": lambda s: s.new("orders-rocksdb"),
    "/ckpt/orders-v2": lambda s: s.new("orders-v2"),
    "/ckpt/orders-v3": lambda s: s.new("orders-v3"),
    "NEW": lambda s: s.new("NEW"),
    "/savepoints": lambda s: str(s.tmp / "savepoints"),
    "/savepoints/orders-edited": lambda s: s.new("orders-edited"),
    "/savepoints/orders-backfilled": lambda s: s.new("orders-backfilled"),
    "/savepoints/orders-reread": lambda s: s.new("orders-reread"),
    "/savepoints/orders-bootstrapped": lambda s: s.new("orders-bootstrapped"),
    "/ckpt/orders-new": lambda s: s.new("orders-new"),
    "/savepoints/savepoint-f265d1-41-1a2b3c4d": lambda s: s.savepoint(),
    "SP": lambda s: s.savepoint(),
    "s3://bucket/ckpt": lambda s: f"s3://{s.bucket()}/ckpt/orders",
    "s3://bucket/ckpt/orders": lambda s: f"s3://{s.bucket()}/ckpt/orders",
    "s3://bucket/savepoints": lambda s: f"s3://{s.bucket()}/savepoints",
    "s3://lake/checkpoints": lambda s: f"s3://{s.bucket()}/ckpt",
    "s3://lake/ckpt/orders": lambda s: f"s3://{s.bucket()}/ckpt/orders",
    "endpoint_url=http://minio:9000": lambda s: f"endpoint_url={s.endpoint()}",
    "key=$KEY": lambda s: "key=testing",  # moto takes any credentials
    "secret=$SECRET": lambda s: "secret=testing",
    "jobs/orders.py:build": lambda s: s.query("jobs/orders.py:build"),
    "jobs.orders:build": lambda s: s.query("jobs.orders:build"),
}


def looks_like_placeholder(token: str) -> bool:
    """A path, a URL, a $VARIABLE, an ALL-CAPS name or a MODULE:FUNCTION: something the docs
    made up."""
    value = token.partition("=")[2] if token.startswith("--") else token
    return bool(
        value.startswith("/")
        or "$" in value
        or "://" in value
        or re.fullmatch(r"[A-Z][A-Z0-9_]+", value)
        or re.fullmatch(r"[\w./-]+:\w+", value)
    )


@dataclass
class DocCommand:
    where: str  # file:line
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # from export lines above it
    expected_rc: int = 0

    def unmapped(self) -> list[str]:
        tokens = self.argv + list(self.env.values())
        return [t for t in tokens if t not in PLACEHOLDERS and looks_like_placeholder(t)]

    def resolve(self, sandbox: Sandbox) -> tuple[list[str], dict[str, str]]:
        assert not self.unmapped(), f"{self.where}: unmapped placeholders {self.unmapped()}"

        def m(t: str) -> str:
            return PLACEHOLDERS[t](sandbox) if t in PLACEHOLDERS else t

        return [m(t) for t in self.argv], {k: m(v) for k, v in self.env.items()}


def doc_commands(name: str, text: str | None = None) -> tuple[list[DocCommand], list[str]]:
    """The statectl commands of one doc file, and the lines it shows that are not mapped."""
    commands: list[DocCommand] = []
    unknown: list[str] = []
    fence: str | None = None
    env: dict[str, str] = {}
    if text is None:
        text = (ROOT / name).read_text()
    lines = list(enumerate(text.splitlines(), 1))
    while lines:
        n, line = lines.pop(0)
        while line.endswith("\\") and lines:  # a command continued on the next line
            line = line[:-1] + " " + lines.pop(0)[1].strip()
        if line.startswith("```"):
            fence = line[3:].strip() if fence is None else None
            env = {}
            continue
        if fence != "bash" or not line.strip() or line.lstrip().startswith("#"):
            continue
        comment = line.partition(" #")[2]
        rc = re.search(r"\(exit code (\d+)\)", comment)
        tokens = shlex.split(line, comments=True)
        segments: list[list[str]] = [[]]
        for t in tokens:
            if t == "&&":
                segments.append([])
            else:
                segments[-1].append(t)
        for seg in segments:
            if seg[0] == "statectl":
                commands.append(
                    DocCommand(f"{name}:{n}", seg, dict(env), int(rc.group(1)) if rc else 0)
                )
            elif seg[0] == "export" and len(seg) == 2 and "=" in seg[1]:
                k, _, v = seg[1].partition("=")
                env[k] = v
            elif shlex.join(seg) not in OTHER_COMMANDS:
                unknown.append(f"{name}:{n}: {shlex.join(seg)}")
    return commands, unknown


ALL = [c for f in DOC_FILES for c in doc_commands(f)[0]]


def test_every_doc_command_is_mapped():
    problems = [u for f in DOC_FILES for u in doc_commands(f)[1]]
    problems += [f"{c.where}: {shlex.join(c.argv)}: {c.unmapped()}" for c in ALL if c.unmapped()]
    assert not problems, "commands in the docs the doc test cannot run:\n" + "\n".join(problems)
    assert len(ALL) >= 20  # the parser found the blocks


def test_the_parser_reads_continued_lines_env_and_exit_codes():
    text = """
```bash
export STATECTL_SAVEPOINT_DIR=/savepoints   # for the next command
statectl --storage-option endpoint_url=http://minio:9000 \\
         --storage-option key="$KEY" --storage-option secret="$SECRET" \\
         list s3://lake/checkpoints
statectl inspect /checkpoints/missing   # fails (exit code 2)
statectl inspect /data/elsewhere
make docs
```
"""
    commands, unknown = doc_commands("x.md", text)
    assert [c.argv for c in commands] == [
        ["statectl", "--storage-option", "endpoint_url=http://minio:9000", "--storage-option",
         "key=$KEY", "--storage-option", "secret=$SECRET", "list", "s3://lake/checkpoints"],
        ["statectl", "inspect", "/checkpoints/missing"],
        ["statectl", "inspect", "/data/elsewhere"],
    ]  # fmt: skip
    assert commands[0].env == {"STATECTL_SAVEPOINT_DIR": "/savepoints"}
    assert [c.expected_rc for c in commands] == [0, 2, 0]
    assert [c.unmapped() for c in commands] == [[], [], ["/data/elsewhere"]]
    assert unknown == ["x.md:9: make docs"]


def run_command(cmd: DocCommand, sandbox: Sandbox) -> subprocess.CompletedProcess:
    argv, env = cmd.resolve(sandbox)
    tmp = sandbox.tmp / "tmpdir"  # the command's TMPDIR: it must leave nothing there
    tmp.mkdir(exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "statectl.cli", *argv[1:]],
        cwd=sandbox.cwd,
        env={**os.environ, **sandbox.env, **env, "TMPDIR": str(tmp)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == cmd.expected_rc, (
        f"{cmd.where}: {shlex.join(argv)} exited {proc.returncode}, the docs say "
        f"{cmd.expected_rc}\n{proc.stdout}\n{proc.stderr}"
    )
    # Not a statectl-log4j-* (every --query run left one) nor any other temporary file.
    assert list(tmp.iterdir()) == [], f"{cmd.where}: left {list(tmp.iterdir())} in TMPDIR"
    return proc


@pytest.mark.parametrize(
    "cmd",
    [
        pytest.param(c, id=c.where, marks=[pytest.mark.spark] if "--query" in c.argv else [])
        for c in ALL
    ],
)
def test_doc_command_runs(cmd: DocCommand, tmp_path, request):
    run_command(cmd, Sandbox(tmp_path, request))


def python_blocks(name: str, spark: bool = False) -> list[str]:
    """The ``python`` blocks; with ``spark``, the ``python spark`` blocks (they plan a query)
    too, in order."""
    blocks, current, fence = [], [], None
    wanted = ("python", "python spark") if spark else ("python",)
    for line in (ROOT / name).read_text().splitlines():
        if line.startswith("```"):
            if fence in wanted:
                blocks.append("\n".join(current))
            fence, current = (line[3:].strip() if fence is None else None), []
        elif fence:
            current.append(line)
    return blocks


def test_api_md_examples_run(tmp_path, request):
    """docs/api.md's blocks, in order, in one namespace, with the quoted paths mapped."""
    run_api_md(tmp_path, request, spark=False)


@pytest.mark.spark
def test_api_md_examples_with_spark_run(spark, tmp_path, request, monkeypatch):
    """With the ``python spark`` blocks, run where the docs' query module is."""
    sandbox = Sandbox(tmp_path, request)
    sandbox.query("jobs/orders.py:build")
    monkeypatch.chdir(sandbox.cwd)
    run_api_md(tmp_path, request, spark=True, sandbox=sandbox)


def run_api_md(tmp_path, request, *, spark: bool, sandbox: Sandbox | None = None) -> None:
    sandbox = sandbox or Sandbox(tmp_path, request)
    blocks = python_blocks("docs/api.md", spark)
    assert len(blocks) >= 5
    namespace: dict = {"__name__": "docs_api"}
    for i, code in enumerate(blocks):
        literals = re.findall(r'"([^"]*)"', code)
        bad = [t for t in literals if t not in PLACEHOLDERS and looks_like_placeholder(t)]
        assert not bad, f"docs/api.md block {i + 1}: unmapped placeholders {bad}"
        for t in set(literals) & set(PLACEHOLDERS):
            code = code.replace(f'"{t}"', repr(PLACEHOLDERS[t](sandbox)))
        exec(compile(code, f"docs/api.md block {i + 1}", "exec"), namespace)


def fenced_blocks(name: str, language: str) -> list[str]:
    """The fenced blocks of ``language`` in ``name``."""
    return re.findall(rf"^```{language}\n(.*?)^```$", (ROOT / name).read_text(), re.M | re.S)


def test_readme_statectl_toml_gives_the_storage_options_it_shows(tmp_path, monkeypatch):
    """README's ``statectl.toml``, read by statectl's own reader: its ``[storage."s3://lake/"]``
    options apply to a path under the prefix and to no other bucket."""
    from statectl.io import storage_options_for

    (block,) = fenced_blocks("README.md", "toml")
    (tmp_path / "statectl.toml").write_text(block)
    monkeypatch.setenv("STATECTL_CONFIG", str(tmp_path / "statectl.toml"))
    assert storage_options_for("s3://lake/checkpoints/orders") == {
        "endpoint_url": "http://minio:9000",
        "key": "minio",
        "secret": "minio123",
    }
    assert storage_options_for("s3://elsewhere/x") == {}


def test_guide_statectl_toml_gives_the_storage_options_it_shows(tmp_path, monkeypatch):
    """The guide's ``statectl.toml`` (indented in its list): each prefix's options apply to
    paths under it only."""
    from statectl.io import storage_options_for

    (block,) = re.findall(
        r"^  ```toml\n(.*?)^  ```$", (ROOT / "docs/guide.md").read_text(), re.M | re.S
    )
    (tmp_path / "statectl.toml").write_text(textwrap.dedent(block))
    monkeypatch.setenv("STATECTL_CONFIG", str(tmp_path / "statectl.toml"))
    assert storage_options_for("s3://lake/ckpt/orders") == {
        "endpoint_url": "http://minio:9000",
        "key": "minio",
        "secret": "minio123",
    }
    assert storage_options_for("s3://public-data/x") == {"anon": True}
    assert storage_options_for("s3://elsewhere/x") == {}


@pytest.mark.spark
def test_guide_python_block_runs(spark, tmp_path, request):
    """The guide's ``From Python`` block: a savepoint on S3 (moto's server), then
    ``stop_with_savepoint`` of a running query (a count per key over one small file)."""
    import s3fs

    import statectl

    (code,) = python_blocks("docs/guide.md")
    sandbox = Sandbox(tmp_path, request)
    for t in set(re.findall(r'"([^"]*)"', code)):
        assert t in PLACEHOLDERS or not looks_like_placeholder(t), t
        if t in PLACEHOLDERS:
            code = code.replace(f'"{t}"', repr(PLACEHOLDERS[t](sandbox)))
    events = tmp_path / "events"
    events.mkdir()
    (events / "0.json").write_text('{"k": "a"}\n{"k": "b"}\n{"k": "a"}\n')
    query = (
        spark.readStream.schema("k string").json(str(events)).groupBy("k").count()
        .writeStream.format("noop").outputMode("update")
        .option("checkpointLocation", str(tmp_path / "ck")).start()
    )  # fmt: skip
    try:
        query.processAllAvailable()
        namespace = {"__name__": "docs_guide", "query": query}
        exec(compile(code, "docs/guide.md python block", "exec"), namespace)
    finally:
        query.stop()
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": sandbox.endpoint()})
    (on_s3,) = fs.ls(f"{sandbox.bucket()}/savepoints")
    assert fs.exists(f"{on_s3}/_metadata")
    sp = namespace["sp"]
    assert sp.batch == 0 and sp.path.startswith(f"file://{tmp_path / 'savepoints'}/")
    counts = statectl.read_state(sp.path).to_pylist()
    assert sorted((r["key"]["k"], r["value"]["count"]) for r in counts) == [("a", 2), ("b", 1)]
