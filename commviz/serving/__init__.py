"""A collector's HTTP face: one asyncio server (server.py) that holds hostile
clients (guard.py: a connection cap and deadlines) and counts what they do wrong
(complaints.py) without a traceback each."""
