"""What the flow view costs the UI thread per snapshot: `FlowView.update_data` (the
static layer rebuilt: layout lookup, canvas, edges or the grid's cells, nodes) on a
synthetic world, median over repeats, with nothing else running; and one animation
step (`advance`). Headless (Textual's run_test).

    python bench/flow_build.py [--ranks 1024] [--size 160x50] [--repeat 60]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from textual.app import App  # noqa: E402

from commviz.model.diagnosis import RankStatus  # noqa: E402
from commviz.model.flows import EdgeRate  # noqa: E402
from commviz.tui.widgets.flow import FlowView  # noqa: E402
from commviz.view.flow import FlowData, FlowNode  # noqa: E402


def world(n: int, tick: int) -> FlowData:
    """n ranks on hosts of 8 in a ring all_reduce: every rank sends to the next, one
    in 97 is waiting (which one moves with `tick`)."""
    nodes = [FlowNode(r, f"node{r // 8}", r % 8, RankStatus.WAITING if (r + tick) % 97 == 0 else RankStatus.OK,
                      "all_reduce") for r in range(n)]
    rates = {(r, (r + 1) % n): EdgeRate(r, (r + 1) % n, 1e9 + r, 0.0, "all_reduce") for r in range(n)}
    return FlowData(nodes=nodes, rates=rates, recent=list(rates), banner="all_reduce")


async def run(n: int, size: tuple[int, int], repeat: int) -> None:
    class One(App):
        def compose(self):
            yield FlowView(id="flow")

    app = One()
    async with app.run_test(size=size) as pilot:
        view = app.query_one(FlowView)
        data = [world(n, i) for i in range(20)]
        view.update_data(data[0])
        await pilot.pause()
        builds, steps = [], []
        for i in range(repeat):
            t = time.perf_counter()
            view.update_data(data[i % len(data)])
            builds.append(time.perf_counter() - t)
        for _ in range(200):
            t = time.perf_counter()
            view.advance(1 / 30)
            steps.append(time.perf_counter() - t)
        kind = view.flow_layout.kind if view.flow_layout else "-"
    print(f"{n} ranks, {kind} layout, {size[0]}x{size[1]}: update_data {1e3 * statistics.median(builds):.2f} ms, "
          f"advance {1e3 * statistics.median(steps):.3f} ms (medians)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--size", default="160x50")
    ap.add_argument("--repeat", type=int, default=60)
    args = ap.parse_args()
    w, h = (int(x) for x in args.size.lower().split("x"))
    asyncio.run(run(args.ranks, (w, h), args.repeat))


if __name__ == "__main__":
    main()
