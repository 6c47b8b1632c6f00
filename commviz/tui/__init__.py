"""Textual dashboard (only `commviz.cli` imports this package)."""
