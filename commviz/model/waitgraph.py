"""The wait-for graph of stuck units and its root causes.

Unit X points to unit Y when a rank X waits for is itself stuck in Y. Strongly
connected components are cycles (deadlocks, or collectives called in a different
order); components nothing else explains — the sinks — are the root causes, and every
other unit is stuck behind one of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from commviz.model.waits import Unit


def sccs(n: int, edges: list[list[int]]) -> list[int]:
    """Tarjan's strongly connected components, iteratively; returns comp id per node."""
    index = [-1] * n
    low = [0] * n
    on = [False] * n
    comp = [-1] * n
    stack: list[int] = []
    counter = 0
    ncomp = 0
    for root in range(n):
        if index[root] >= 0:
            continue
        work = [(root, 0)]
        while work:
            v, i = work[-1]
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on[v] = True
            if i < len(edges[v]):
                work[-1] = (v, i + 1)
                w = edges[v][i]
                if index[w] < 0:
                    work.append((w, 0))
                elif on[w]:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on[w] = False
                    comp[w] = ncomp
                    if w == v:
                        break
                ncomp += 1
    return comp


@dataclass
class WaitGraph:
    units: list[Unit]
    edges: list[list[int]]
    comp: list[int]
    members: dict[int, list[int]] = field(default_factory=dict)  # comp -> units
    sinks: list[int] = field(default_factory=list)
    upstream: dict[int, list[int]] = field(default_factory=dict)  # sink comp -> units behind it


def build_graph(units: list[Unit]) -> WaitGraph:
    stuck_in: dict[int, list[int]] = {}
    for i, u in enumerate(units):
        for w in u.stuck():
            stuck_in.setdefault(w.rank, []).append(i)
    edges: list[list[int]] = []
    for u in units:
        if u.dead:
            edges.append([])  # a dead rank is a root cause whatever else is going on
            continue
        out = sorted({j for m in u.missing for j in stuck_in.get(m, [])})
        edges.append(out)
    comp = sccs(len(units), edges)
    g = WaitGraph(units, edges, comp)
    for i, c in enumerate(comp):
        g.members.setdefault(c, []).append(i)
    cedges: dict[int, set[int]] = {c: set() for c in g.members}
    for i, outs in enumerate(edges):
        for j in outs:
            if comp[j] != comp[i]:
                cedges[comp[i]].add(comp[j])
    g.sinks = sorted(c for c, outs in cedges.items() if not outs)
    reach: dict[int, set[int]] = {}

    def sinks_from(c: int) -> set[int]:
        # The condensation is acyclic; walk it without recursion.
        todo, seen, found = [c], {c}, set()
        while todo:
            x = todo.pop()
            if not cedges[x]:
                found.add(x)
            for y in cedges[x]:
                if y not in seen:
                    seen.add(y)
                    todo.append(y)
        return found

    for c in g.members:
        if cedges[c]:
            reach[c] = sinks_from(c)
            for s in reach[c]:
                g.upstream.setdefault(s, []).extend(g.members[c])
    return g
