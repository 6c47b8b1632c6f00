"""Entry point for `python -m commviz.run` (see commviz.probe.run)."""

import sys

from commviz.probe.run import main

if __name__ == "__main__":
    sys.exit(main())
