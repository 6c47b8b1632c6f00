"""What a dashboard shows, as plain typed data: the snapshot of a model, the flow
view's nodes and edges, the alerts' rows, and the feeds that take them.

Kept apart from `tui/` so that whoever builds a view needs no screen: the collector
(`commviz serve`) takes snapshots for remote dashboards and sends them as msgspec
(viewlink.py), and must not load Textual or rich to do it (tests/view). `tui/` only
draws what is here. Nothing in this package imports `commviz.tui`, textual or rich.
"""
