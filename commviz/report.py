"""Plain-text rendering of the summary document (for `commviz summary`/`record`)."""

from __future__ import annotations

from commviz.events import QUIET_OP
from commviz.units import format_bytes


def _table(headers: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows]


def render_summary(s: dict, problems: list[str] | None = None) -> str:
    out = [f"world size {s['world_size']} · backend {s['backend'] or '?'} · {s.get('events', 0)} events"]
    ranks = s["ranks"]
    if ranks:
        out.append("")
        out += _table(
            ["rank", "host", "pid", "device", "status", "dropped"],
            [[str(r["rank"]), r["host"], str(r["pid"]), r["device"], r["status"], str(r.get("dropped", 0))] for r in ranks],
            {0, 2, 5},
        )
    out += _audit_lines(s.get("per_rank", []))
    out += _nccl_lines(s.get("per_rank", []))
    out.append("")
    if s["ops"]:
        out += _table(
            ["op", "group", "count", "bytes", "p50 µs", "p99 µs", "algbw GB/s", "busbw GB/s"],
            [
                [
                    o["op"],
                    o["group"],
                    str(o["count"]),
                    format_bytes(o["bytes"]),
                    f"{o['p50_us']:.1f}",
                    f"{o['p99_us']:.1f}",
                    f"{o['algbw_gbps']:.3f}",
                    f"{o['busbw_gbps']:.3f}",
                ]
                for o in s["ops"]
            ],
            {2, 3, 4, 5, 6, 7},
        )
    else:
        out.append("no ops recorded")
    for d in s.get("diagnoses", []):
        out.append("")
        out += render_diagnosis(d)
    if s.get("decode_errors"):
        out.append(f"{s['decode_errors']} frames could not be decoded")
    for p in problems or []:
        out.append(f"note: {p}")
    return "\n".join(out)


def render_diagnosis(d: dict, max_frames: int = 4) -> list[str]:
    """A diagnosis as a person reads it: the message, who waits for whom, and where
    each involved rank is stuck (its own code first)."""
    lines = [f"{d['kind'].upper()}: {d['message']}"]
    who = []
    for key, label in (("waiting_ranks", "waiting"), ("missing_ranks", "missing"), ("culprit_ranks", "culprit")):
        if d.get(key):
            who.append(f"{label} {','.join(map(str, d[key]))}")
    if who:
        lines.append("  " + " · ".join(who))
    rc = (d.get("details") or {}).get("roll_call")
    if rc:
        lines.append("  roll-call (where the ranks are, odd ones first):")
        for g in rc["groups"]:
            n, state = g["count"], f"in {g['op']}" if g["op"] else "in no op"
            at = f", in {g['function']} at {g['where']}" if g["where"] else ", no stack yet"
            lines.append(f"    {n} rank{'s' if n > 1 else ''} {state}{at}: {g['ranks']}")
        if rc.get("more_groups"):
            lines.append(f"    … {rc['more_groups']} more groups (commviz summary --json)")
    for st in d.get("stacks") or []:
        where = st.get("where") or ""
        state = "in no op, at" if st.get("op_id") == QUIET_OP else "stuck at"
        lines.append(f"  rank {st['rank']} ({st.get('thread') or 'thread ?'}) {state} {where}")
        frames = [f for f in st.get("frames", []) if f.get("user")][:max_frames]
        for f in frames:
            text = f" — {f['text']}" if f.get("text") else ""
            lines.append(f"      {f['file']}:{f['line']} in {f.get('function', '')}{text}")
    return lines


def _audit_lines(per_rank: list[dict]) -> list[str]:
    """Under the rank table: collectives the backend ran that commviz did not see,
    and why a rank could not be audited (ranks sharing a reason share a line)."""
    lines, states = [], {}
    for pr in per_rank:
        a = pr.get("audit")
        if not a:
            continue
        if "state" in a:
            states.setdefault(a["state"], []).append(pr["rank"])
        elif a.get("unseen"):
            ops = ", ".join(f"{n} {op}" for op, n in sorted(a["unseen"].items()))
            lines.append(f"rank {pr['rank']}: unseen by commviz: {ops} of {sum(a['backend'].values())} backend ops "
                         "(a ProcessGroup method called directly, or a C++ extension)")
    for state, ranks in states.items():
        lines.append(f"audit of rank{'s' if len(ranks) > 1 else ''} {','.join(map(str, ranks))}: {state}")
    return lines


def _nccl_lines(per_rank: list[dict]) -> list[str]:
    """What NCCL itself ran (its profiler plugin), per communicator and NCCL function,
    over the ranks that said: each rank's count (one number where they agree, the
    range where they do not: a rank that ran fewer is the one to look at), the bytes
    of all of them, mean GPU time, and CUDA-graph replays (the probe sees a captured
    op once; NCCL sees each replay)."""
    by: dict[tuple[str, str], list[tuple[dict, int | None]]] = {}
    for pr in per_rank:
        for comm, doc in (pr.get("nccl") or {}).items():
            for func, tally in doc.get("ops", {}).items():
                by.setdefault((comm, func), []).append((tally, doc.get("nranks")))
    rows = []
    for (comm, func), got in sorted(by.items()):
        counts = [t["count"] for t, _ in got]
        nranks = got[0][1]
        timed = sum(t.get("timed", 0) for t, _ in got)
        replays = sum(t.get("replays", 0) for t, _ in got)
        rows.append([
            func, comm, f"{len(got)} of {nranks}" if nranks else str(len(got)),
            str(counts[0]) if min(counts) == max(counts) else f"{min(counts)}–{max(counts)}",
            format_bytes(sum(t["bytes"] for t, _ in got)),
            f"{sum(t.get('device_ns', 0) for t, _ in got) / timed / 1e3:.1f}" if timed else "–",
            str(replays) if replays else "–",
        ])
    if not rows:
        return []
    return ["", "what NCCL itself ran (its profiler plugin):"] + _table(
        ["nccl op", "communicator", "ranks", "count", "bytes", "GPU µs", "graph replays"], rows, {2, 3, 4, 5, 6})
