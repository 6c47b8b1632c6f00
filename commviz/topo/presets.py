"""Named fixtures shipped with commviz: machines described from public facts, so the
topology view, replay (`--topology`) and tests can show a DGX where there is none."""

from __future__ import annotations

import json
from importlib import resources

from commviz.topo.fake import FakeNvml, FixtureError, check_fixture


def preset_names() -> list[str]:
    """Every shipped preset, sorted."""
    folder = resources.files("commviz.topo") / "presets"
    return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def preset_fixture(name: str) -> dict:
    """The checked fixture document of a preset; FixtureError naming the choices if unknown."""
    if name not in preset_names():
        raise FixtureError(f"no preset named {name!r}; presets: {', '.join(preset_names())}")
    text = (resources.files("commviz.topo") / "presets" / f"{name}.json").read_text(encoding="utf-8")
    return check_fixture(json.loads(text))


def load_preset(name: str) -> FakeNvml:
    """A fake backend playing the preset; its topology's source is ``preset:<name>``."""
    return FakeNvml(preset_fixture(name), source=f"preset:{name}")
