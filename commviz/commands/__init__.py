"""The `commviz` commands, one module each; `COMMANDS` is the registry `commviz.cli`
builds its parser and dispatch from (in the order `--help` lists them)."""

from __future__ import annotations

from commviz.commands import (attach, demo, doctor, export, lesson, nvml_dump, record, relay, replay, serve, summary,
                              topo, watch, web)
from commviz.commands.base import Command

COMMANDS: list[Command] = [
    watch.COMMAND,
    record.COMMAND,
    serve.COMMAND,
    web.COMMAND,
    replay.COMMAND,
    summary.COMMAND,
    attach.COMMAND,
    export.COMMAND,
    demo.COMMAND,
    lesson.COMMAND,
    relay.COMMAND,
    topo.COMMAND,
    nvml_dump.COMMAND,
    doctor.COMMAND,
]
BY_NAME: dict[str, Command] = {c.name: c for c in COMMANDS}

__all__ = ["BY_NAME", "COMMANDS", "Command"]
