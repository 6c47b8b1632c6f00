"""Opening torch's own files: flight-recorder dumps (JSON or pickle) and profiler
Chrome traces (.json, .json.gz), a file or a directory of per-rank files, recognised
by content. Each file is untrusted: read with a size limit, pickles only through the
plain-data loader, and a file that cannot be used costs one line naming it and why
while the rest of the directory still loads."""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

from commviz.trace import flightrec, kineto, safepickle
from commviz.trace.file import Loaded

MAX_FILE = 512 * 1024 * 1024  # on disk, and once decompressed
FLIGHT, PROFILE = "flight recorder dump", "profiler trace"
_EXTS = (".gz", ".json", ".pkl", ".pickle")


class TorchFileError(ValueError):
    """One file that is none of torch's files we read; the message names it and why."""


def rank_from_name(path: str | os.PathLike, rank_map: dict[str, int]) -> int | None:
    """The rank a file's name gives: an explicit mapping first (by file name or path),
    else the trailing digits once known extensions are dropped (`nccl_trace_rank_3`,
    `fr_3.json`, `trace_rank0.json.gz`)."""
    p = str(path)
    for key in (p, os.path.basename(p)):
        if key in rank_map:
            return rank_map[key]
    name = os.path.basename(p)
    while name.endswith(_EXTS):
        name = name[: name.rindex(".")]
    m = re.search(r"(\d+)$", name)
    return int(m.group(1)) if m else None


def parse_rank_map(items: list[str] | None) -> dict[str, int]:
    """`NAME=RANK` items (each may hold several, comma-separated); ValueError names a bad one."""
    out: dict[str, int] = {}
    for item in items or []:
        for part in item.split(","):
            name, sep, rank = part.strip().rpartition("=")
            if not sep or not name or not rank.isdigit():
                raise ValueError(f"--rank-map {part!r}: expected FILE=RANK, e.g. --rank-map dump_a=0")
            out[name] = int(rank)
    return out


def _read(path: Path) -> bytes:
    size = path.stat().st_size
    if size > MAX_FILE:
        raise TorchFileError(f"{path}: {size} bytes, over the {MAX_FILE}-byte limit for torch's files")
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        try:
            with gzip.GzipFile(fileobj=__import__("io").BytesIO(data)) as g:
                data = g.read(MAX_FILE + 1)
        except (OSError, EOFError) as exc:
            raise TorchFileError(f"{path}: broken gzip: {exc}") from None
        if len(data) > MAX_FILE:
            raise TorchFileError(f"{path}: over {MAX_FILE} bytes once decompressed")
    return data


def _decode(path: Path, data: bytes) -> object:
    """The document in a file: JSON, or a plain-data pickle."""
    head = data.lstrip()[:1]
    if head in (b"{", b"["):
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise TorchFileError(f"{path}: not valid JSON: {str(exc)[:120]}") from None
    if data[:1] == b"\x80":
        try:
            return safepickle.loads(data)
        except safepickle.UnsafePickle as exc:
            raise TorchFileError(f"{path}: refused: {exc}") from None
    what = "empty" if not data else f"starts with {data[:8]!r}"
    raise TorchFileError(f"{path}: not a commviz trace, flight-recorder dump or profiler trace ({what})")


def read_one(path: Path, rank_map: dict[str, int]) -> tuple[str, object]:
    """(kind, parsed) for one of torch's files: a flightrec.Dump or a kineto.RankTrace."""
    doc = _decode(path, _read(path))
    hint = rank_from_name(path, rank_map)
    if kineto.is_profile(doc):
        try:
            return PROFILE, kineto.parse(doc, hint)
        except kineto.ProfileError as exc:
            raise TorchFileError(f"{path}: {exc}") from None
    if hint is None:
        raise TorchFileError(f"{path}: a flight-recorder dump names no rank and its file name ends in no digits; "
                             f"say which rank wrote it: --rank-map {path.name}=RANK")
    try:
        return FLIGHT, flightrec.parse_dump(doc, hint, path.stat().st_mtime_ns)
    except flightrec.DumpError as exc:
        raise TorchFileError(f"{path}: {exc}") from None


def load_torch(paths: list[Path], rank_map: dict[str, int] | None = None, job: str = "") -> Loaded:
    """Every file of `paths` that is one of torch's; TorchFileError when none is."""
    out = Loaded(snapshot=True)
    found: dict[str, dict[int, tuple[Path, object]]] = {FLIGHT: {}, PROFILE: {}}
    for p in paths:
        try:
            kind, parsed = read_one(p, rank_map or {})
        except (TorchFileError, OSError) as exc:
            out.problems.append(str(exc) if isinstance(exc, TorchFileError) else f"{p}: {exc.strerror or exc}")
            continue
        same = found[kind].get(parsed.rank)
        if same is not None:
            out.problems.append(f"{p}: says rank {parsed.rank}, as {same[0]} does; kept {same[0]} "
                                f"(--rank-map {p.name}=RANK to place it)")
            continue
        found[kind][parsed.rank] = (p, parsed)
    kind = FLIGHT if found[FLIGHT] else PROFILE
    if not found[kind]:
        why = out.problems[0] if len(out.problems) == 1 else "; ".join(out.problems[:3])
        raise TorchFileError(why or "no files")
    other = PROFILE if kind == FLIGHT else FLIGHT
    if found[other]:
        out.problems.append(f"{len(found[other])} {other}(s) left out: open them on their own "
                            "(one kind of file at a time)")
    chosen = found[kind]
    out.files = [str(p) for p, _ in chosen.values()]
    job = job or f"torch files: {os.path.commonpath(out.files)}"
    if kind == FLIGHT:
        batches, notes = flightrec.to_batches({r: d for r, (_, d) in chosen.items()}, job)
        out.notes += [f"flight-recorder dumps of ranks {_ranks(sorted(chosen))}; each is a moment of its rank "
                      "(the file's time), not a record of the whole run"] + notes
    else:
        traces = [t for _, (_, t) in sorted(chosen.items())]
        batches = [kineto.to_batch(t, job) for t in traces]
        out.notes += [f"profiler traces of ranks {_ranks(sorted(chosen))}: only the profiled window"]
        out.notes += sorted({n for t in traces for n in t.notes})
    out.batches = batches
    return out


def _ranks(ranks: list[int]) -> str:
    return ",".join(map(str, ranks))
