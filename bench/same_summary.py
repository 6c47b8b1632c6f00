"""Whether `commviz summary --json` says the same, byte for byte, before and after a
change, on the traces given: the check a refactor of the model answers to.

    python bench/same_summary.py --base REV TRACE [TRACE ...]

Checks REV out into a temporary git worktree (the compiled parts of this tree copied
in, so both sides read frames the same way), runs `summary --json` on each trace with
each tree, and prints `same` or `DIFFERENT` per trace; the last line counts them, and
the exit status is 1 if any differ. Traces to try: `python bench/synth.py --ranks 64
--ops 400 -o s64.cvz`, and `commviz record -o hang.cvz --hang-timeout 3 -- torchrun
--nproc-per-node 4 commviz/scenarios/hang.py` (any scenario).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUMMARY = "import sys; from commviz.cli import main; sys.exit(main(['summary', '--json', sys.argv[1]]))"


def summary(tree: str, trace: str) -> tuple[int, bytes]:
    """`summary --json` of `trace` as `tree`'s commviz says it (run from outside both
    trees, so only PYTHONPATH picks the code)."""
    env = {**os.environ, "PYTHONPATH": tree}
    p = subprocess.run([sys.executable, "-c", SUMMARY, os.path.abspath(trace)], env=env, cwd=tempfile.gettempdir(),
                       capture_output=True, timeout=600)
    return p.returncode, p.stdout


def compiled_parts(tree: str) -> list[str]:
    """The compiled parts built in place in `tree` (paths relative to it)."""
    out = []
    for d, _, files in os.walk(os.path.join(tree, "commviz")):
        out += [os.path.relpath(os.path.join(d, f), tree) for f in files if f.endswith(".so")]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the revision to compare with (e.g. HEAD~3)")
    ap.add_argument("traces", nargs="+")
    a = ap.parse_args()
    base = tempfile.mkdtemp(prefix="same-summary-")
    subprocess.run(["git", "-C", REPO, "worktree", "add", "-q", "--detach", base, a.base], check=True)
    try:
        for rel in compiled_parts(REPO):
            if os.path.isdir(os.path.dirname(os.path.join(base, rel))):
                shutil.copy2(os.path.join(REPO, rel), os.path.join(base, rel))
        differ = 0
        for trace in a.traces:
            before, after = summary(base, trace), summary(REPO, trace)
            same = before == after and before[0] == 0
            differ += not same
            why = "" if same else f"  (exit {before[0]} before, {after[0]} after; {len(before[1])} and {len(after[1])} bytes)"
            print(f"{'same' if same else 'DIFFERENT'}  {trace}{why}")
        print(f"{len(a.traces) - differ} of {len(a.traces)} summaries the same as at {a.base}")
        return 1 if differ else 0
    finally:
        subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", base], check=False)


if __name__ == "__main__":
    sys.exit(main())
