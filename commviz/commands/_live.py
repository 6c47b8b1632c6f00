"""What `watch`, `record` and `demo` share: where to listen, who may connect, and the
live feed (transport → model) that the dashboard or the summary reads."""

from __future__ import annotations

import os
import tempfile

from commviz.errors import CommvizError
from commviz.transport.address import AddressError, default_addr, private_dir


def listen_addr(listen: str | None, private_name: str | None = None) -> str:
    """`--listen` if given; else a private per-run socket for a job we launch, else
    the per-user default socket (its directory created and checked)."""
    if listen:
        return listen
    if private_name:
        return f"ipc://{os.path.join(private_dir(), private_name)}"
    private_dir()
    return default_addr()


def token(addr: str) -> str | None:
    """The listener's token (transport/token.py: every TCP listener wants one); a
    launched job inherits it through the environment."""
    from commviz.transport.token import listener_token

    return listener_token(addr)


def open_feed(listen: str | None, private_name: str | None, record_to: str | None, hang_after_s: float,
              with_rings: bool, ring_dir: str | None = None):
    """A started `LiveFeed`, and the directory our launched job's crash rings go to
    (`ring_dir`, or a new one `with_rings`; None otherwise). Raises CommvizError when
    it cannot listen."""
    from commviz.watcher import LiveFeed

    try:
        addr = listen_addr(listen, private_name)
        if with_rings and ring_dir is None:
            ring_dir = new_ring_dir()
        feed = LiveFeed(addr, record_to=record_to, hang_after_s=hang_after_s, ring_dir=ring_dir,
                        token=token(addr)).start()
    except (AddressError, OSError) as exc:
        raise CommvizError(str(exc)) from exc
    return feed, ring_dir


def new_ring_dir() -> str:
    """A private directory for the crash rings of a job we launch (COMMVIZ_RING_DIR)."""
    return tempfile.mkdtemp(prefix="rings-", dir=private_dir())


METRICS_HELP = ("serve Prometheus metrics on HOST:PORT (a bare PORT listens on 127.0.0.1 only; "
                "0.0.0.0:PORT for every interface); needs prometheus-client: pip install 'commviz[metrics]'")


def metrics_addr(text: str) -> tuple[str, int]:
    """`--metrics`: HOST:PORT, [IPv6]:PORT, :PORT or PORT (these two on 127.0.0.1)."""
    import argparse

    host, sep, port = text.rpartition(":")
    if not sep:
        host = ""
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT or PORT (e.g. 9400, 127.0.0.1:9400, "
                                         "0.0.0.0:9400)")
    return host, int(port)


def start_metrics(where: tuple[str, int] | None, feed):
    """The Prometheus endpoint on `feed` (`--metrics`), or None when not asked for;
    its address goes into the feed's status line. Raises CommvizError when
    prometheus-client is missing or the address is taken."""
    if where is None:
        return None
    try:
        from commviz import metrics
    except ImportError as exc:
        if not (exc.name or "").startswith("prometheus_client"):
            raise
        raise CommvizError("--metrics needs prometheus-client: pip install 'commviz[metrics]' "
                           "(or pip install prometheus-client)") from exc
    server = metrics.serve(metrics.feed_collector(feed), *where)
    feed.metrics_url = server.url
    return server
