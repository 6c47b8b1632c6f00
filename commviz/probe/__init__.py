"""Runs inside each rank: wraps torch.distributed and streams events to the watcher.

Everything here imports torch lazily so that `import commviz` stays cheap."""
