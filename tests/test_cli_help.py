"""Every command's ``--help`` reads at 80 columns: nothing cut, no word broken, real
metavariables, no ``{target}`` in the usage line, a sensible length; restore's and migrate's
options grouped in the panels every helper shares, each with a short help line."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from statectl.cli import app
from statectl.cli.app import Command

PANELS = {"What to restore", "Where", "Conversions", "Evolution", "Engine", "Output"}


def _commands() -> dict[str, Command]:
    import typer.main

    group = typer.main.get_command(app)
    return dict(group.commands)  # type: ignore[attr-defined]


COMMANDS = sorted(_commands())


def _help(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "statectl.cli", *args, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "80", "TERM": "dumb"},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_every_command_is_checked():
    assert {"inspect", "export", "restore", "migrate", "savepoint"} <= set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_help_reads_at_80_columns(name):
    out = _help(name)
    lines = out.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert "…" not in out
    usage = next(line for line in lines if "Usage:" in line)
    assert "{" not in usage, usage
    assert not re.search(r"<(list\[\w+\]|str|int|bool|float|path)>", out), out
    command = _commands()[name]
    words = " ".join(out.split())
    for param in command.params:
        for opt in (*param.opts, *getattr(param, "secondary_opts", ())):
            if opt.startswith("-"):
                assert re.search(rf"(^|[\s,/]){re.escape(opt)}([\s,=]|$)", out), (name, opt)
        for word in (getattr(param, "help", None) or "").split():
            assert word in words, f"{name}: {word!r} of {param.name}'s help is broken"
    assert len(lines) <= 75, f"{name} --help is {len(lines)} lines"


@pytest.mark.parametrize("name", ["restore", "migrate"])
def test_restore_and_migrate_group_their_options_in_the_shared_panels(name):
    command = _commands()[name]
    for param in command.params:
        if param.param_type_name != "option" or param.name == "help":
            continue
        assert getattr(param, "rich_help_panel", None) in PANELS, (name, param.name)
        assert len(param.help or "") <= 60, (name, param.name, param.help)
    out = _help(name)
    shown = {line.rstrip(":") for line in out.splitlines() if line and not line[0].isspace()}
    assert shown & PANELS, out


def test_the_top_level_help_reads_at_80_columns():
    out = _help()
    assert all(len(line) <= 80 for line in out.splitlines())
    assert "…" not in out
    for name in COMMANDS:
        assert re.search(rf"\b{name}\b", out), name


def test_backend_engine_and_output_mode_complete_their_values():
    """What the shell completion (``--install-completion``) offers for the fixed values."""
    for words, want in (
        ("statectl restore T --backend r", ["rocksdb"]),
        ("statectl migrate S T --engine s", ["spark"]),
        ("statectl restore T --output-mode u", ["update"]),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "statectl.cli"],
            env={
                **os.environ,
                "_STATECTL_COMPLETE": "complete_bash",
                "COMP_WORDS": words,
                "COMP_CWORD": str(len(words.split()) - 1),
            },
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.stdout.split() == want, (words, proc.stdout, proc.stderr)
