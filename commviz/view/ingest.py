"""How a live feed keeps up with the wire, beside its model: what /metrics and a
collector's summary read (`ModelFeed.ingest_counts`). Apart from view/feed.py so that
/metrics reads it without loading the feed's model."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class IngestCounts:
    """What a live feed says about keeping up, beside the model: read by /metrics
    and by a collector's summary (`LiveFeed.ingest_counts`)."""

    lag_s: float = 0.0
    shedding: bool = False
    why: str = ""  # while shedding: "behind the job" or "frames lost"
    shed_spells: int = 0
    shed_frames: int = 0
    probe_behind_events: int = 0  # events the probes left out while this feed took none (Counters.behind)
    read_pauses: int = 0  # times the reader waited for room in the inbox (transport/server.py, FULL_PAUSE_S)
    refused_token: int = 0
    refused_limit: int = 0
