"""Wire between ranks and the watcher: zmq DEALER (rank) → ROUTER (watcher), one
msgpack `Batch` per message."""
