"""What the dashboard shows once every rank of the job is gone: the job's summary
as `commviz record` prints it (the per-op table, then the findings), in place of a
flow view that would only say "idle" from then on."""

from __future__ import annotations

from collections import Counter

from rich.console import Group
from rich.text import Text

from commviz.report import render_diagnosis, render_summary
from commviz.tui.alerts import KIND_STYLE


def summary_renderable(s: dict) -> Group:
    """A `Model.summary()` document for the summary panel. The ranks table is left to
    the Ranks panel under it; a line says how the ranks ended instead."""
    ends = Counter(r["status"] for r in s["ranks"])
    how = ", ".join(f"{n} {status}" for status, n in sorted(ends.items()))
    head = Text.assemble(("job ended", "bold"), f" · {how} · ")
    parts: list = [head]
    table = render_summary({**s, "ranks": [], "diagnoses": []}).split("\n")
    head.append(table[0])  # world size · backend · events
    parts.append(Text("\n".join(table[1:]), no_wrap=True, overflow="crop"))
    parts.append(Text(""))
    diags = s.get("diagnoses") or []
    if not diags:
        parts.append(Text("no findings: no hang, desync, p2p deadlock, dead rank or straggler", style="green"))
    for d in diags:
        first, *rest = render_diagnosis(d)
        kind, _, message = first.partition(": ")
        line = Text.assemble((kind, KIND_STYLE.get(d["kind"], "bold")), ": ", message)
        parts.append(line)
        if rest:
            parts.append(Text("\n".join(rest), style="dim", no_wrap=True, overflow="ellipsis"))
        parts.append(Text(""))
    return Group(*parts)
