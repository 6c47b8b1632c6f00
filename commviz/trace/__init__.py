"""Trace files: one format for live recording and replay."""
