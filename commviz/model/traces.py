"""A whole trace handed to a model: its events in the one order every reader uses
(`model/merge.py`), through `Model.ingest`, then `Model.end_of_trace`.

`summary`, the exports, a replay's seek index and `attach` read traces this way, so
they agree on every trace."""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

from commviz.events import Batch, Event
from commviz.model import columns
from commviz.model.merge import order_events
from commviz.model.store import Chunk, EventStore

if TYPE_CHECKING:
    from commviz.model.state import Model


def ingest_trace(model: Model, batches: list[Batch], cut_off: bool = False, snapshot: bool = False) -> None:
    """A whole trace held in memory (`order_events`), then its end."""
    ingest_ordered(model, order_events(batches), cut_off, snapshot)


def ingest_ordered(model: Model, events: Iterable[tuple[int, int, Event]], cut_off: bool = False,
                   snapshot: bool = False) -> None:
    """A whole trace already in the one order (`order_events`, or `order_stream` for a
    trace read in bounded memory), one event at a time, then its end (see
    `Model.end_of_trace` for `cut_off` and `snapshot`)."""
    ingest = model.ingest
    for _, rank, ev in events:
        ingest(rank, ev)
    model.end_of_trace(cut_off, snapshot)


def ingest_chunks(model: Model, chunks: Iterable[Chunk], cut_off: bool = False, snapshot: bool = False,
                  after_chunk: Callable[[], None] | None = None) -> None:
    """`ingest_ordered` for a trace handed on as `Chunk`s in the one order
    (`merge.order_stream_chunks`), then its end. `after_chunk` is called after each
    chunk (a streaming exporter writes out what it was handed)."""
    # Decoding and merging allocate millions of short-lived, acyclic objects: the
    # cyclic collector would walk everything alive again and again for nothing.
    was = gc.isenabled()
    gc.disable()
    try:
        for chunk in _tails_carried(model, chunks):
            model.ingest(chunk)
            if after_chunk is not None:
                after_chunk()
    finally:
        if was:
            gc.enable()
    model.end_of_trace(cut_off, snapshot)


def _tails_carried(model: Model, chunks: Iterable[Chunk]) -> Iterator[Chunk]:
    """`chunks`, each cut where the fewest collectives are half-way among its last
    events (`columns.tail_cut`, with the groups the chunks before it made known):
    the rest goes in with the next chunk, the last rest at the end."""
    carry = None
    for chunk in chunks:
        if carry is not None:
            chunk, carry = Chunk.joined(carry, chunk), None
        cut = columns.tail_cut(chunk, model.groups) if type(chunk.store) is EventStore else len(chunk)
        if cut < len(chunk):
            chunk, carry = chunk.part(0, cut), chunk.part(cut, len(chunk))
        yield chunk
    if carry is not None:
        yield carry
