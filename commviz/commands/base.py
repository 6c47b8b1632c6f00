"""What a command is: a name, its help, its arguments and a `run` that returns the
exit status (or raises `CommvizError`, which carries one)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, list[str]], int]
    description: str | None = None
    takes_cmd: bool = False  # `commviz NAME … -- CMD…` launches CMD

    def add_to(self, sub) -> argparse.ArgumentParser:
        p = sub.add_parser(self.name, help=self.help, description=self.description or None)
        self.add_arguments(p)
        return p


TOPOLOGY_HELP = ("lay GPUs out as this machine: a preset (dgx-h100, dgx-a100, pcie-2gpu, pcie-4gpu-2socket) "
                 "or a fixture file from `commviz nvml-dump`")
JSON_HELP = "the stable JSON document (see docs/ARCHITECTURE.md)"
