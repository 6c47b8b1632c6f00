"""The one compiled part: the watcher's reader loop (commviz/transport/_fastrecv.c).
It needs only the Python headers; where it cannot be built, the install goes on and
pyzmq does the reading, slower (commviz/transport/reader.py)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("commviz.transport._fastrecv", ["commviz/transport/_fastrecv.c"], optional=True)])
