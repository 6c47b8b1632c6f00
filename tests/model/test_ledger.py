"""One writer of the model: what an event changes in `Model` and its `RankState`s is
written in `model/ledger.py` and nowhere else, so the per-event and the batch path
cannot drift apart unseen (they did: columns.py wrote `pending`, `events`, `last_t`
and a rank's counts, `per_group` and `seqs` behind the per-event path's back)."""

from __future__ import annotations

import ast
import dataclasses
import pathlib

import commviz
from commviz.model import Model, ledger
from commviz.model.rank import RankState
from tests.helpers import group, hello, op

ROOT = pathlib.Path(commviz.__file__).parent
MODEL_FIELDS = set(vars(Model()))
RANK_FIELDS = {f.name for f in dataclasses.fields(RankState)}
MUTATORS = {"append", "extend", "insert", "pop", "popitem", "setdefault", "update", "clear", "remove", "discard", "add"}

# Where a name of a model field is written on something that is not the model, and what it is.
NOT_THE_MODEL = {
    ("model/explain.py", "d.stacks"): "a Diagnosis's stacks, as it is explained",
    ("model/rollcall.py", "g.ranks"): "a roll call's group of ranks at one place",
    ("trace/kineto.py", "rt.groups"): "the groups a Kineto trace's reader found",
    ("trace/seek.py", "s.marks"): "a seek index's marks, as its pass finds them",
    ("commands/_collector.py", "got.status"): "a fetched view's status line",
    ("viewlink.py", "got.status"): "a fetched view's status line",
}


def _writes(tree: ast.AST):
    """(class, function, target) of each assignment, augmented assignment, deletion or
    container mutation whose target is `X.f` or `X.f[...]` for a field name f of the
    model or a rank, other than a class's own attribute of that name (`self.f`), or
    whose target is a local name a function bound to such a field (`s = m.stats;
    s[k] = v`, reported as `s = m.stats`)."""
    fields = MODEL_FIELDS | RANK_FIELDS

    def field_of(t, cls):
        """`X.f` that `t` (peeled of subscripts) names, if f is a field not of `self`."""
        while isinstance(t, ast.Subscript):
            t = t.value
        if not isinstance(t, ast.Attribute) or t.attr not in fields | {"__dict__"}:
            return None  # (`__dict__`: every field at once)
        own = isinstance(t.value, ast.Name) and t.value.id == "self" and cls not in ("Model", "RankState")
        return None if own else t

    def aliases_in(fn_node, cls):
        """Local names bound to a field's table in this function, not in nested ones."""
        found, todo = {}, list(ast.iter_child_nodes(fn_node))
        while todo:
            n = todo.pop()
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            if (isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
                    and (t := field_of(n.value, cls)) is not None):
                found[n.targets[0].id] = f"{n.targets[0].id} = {ast.unparse(t)}"
            todo.extend(ast.iter_child_nodes(n))
        return found

    def walk(node, cls, fn, aliases):
        for ch in ast.iter_child_nodes(node):
            c = ch.name if isinstance(ch, ast.ClassDef) else cls
            f = ch.name if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef)) else fn
            a = aliases_in(ch, c) if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef)) else aliases
            targets = []
            if isinstance(ch, (ast.Assign, ast.Delete)):
                targets = ch.targets
            elif isinstance(ch, (ast.AugAssign, ast.AnnAssign)):
                targets = [ch.target]
            elif isinstance(ch, ast.Call) and isinstance(ch.func, ast.Attribute) and ch.func.attr in MUTATORS:
                targets = [ch.func.value]
            if (isinstance(ch, ast.Call) and isinstance(ch.func, ast.Name) and ch.func.id == "setattr"
                    and len(ch.args) > 1 and isinstance(ch.args[1], ast.Constant)
                    and ch.args[1].value in MODEL_FIELDS | RANK_FIELDS):
                yield c, f, ast.unparse(ch)
            for t in targets:
                for t in t.elts if isinstance(t, ast.Tuple) else [t]:
                    if (field := field_of(t, c)) is not None:
                        yield c, f, ast.unparse(field)
                    elif (isinstance(t, ast.Subscript) or isinstance(ch, ast.Call)) and a:
                        while isinstance(t, ast.Subscript):
                            t = t.value
                        if isinstance(t, ast.Name) and t.id in a:  # (rebinding the name writes nothing)
                            yield c, f, a[t.id]
            yield from walk(ch, c, f, a)
    yield from walk(tree, None, None, {})


def test_nothing_but_the_ledger_writes_the_models_fields():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "model/ledger.py" or rel.split("/")[0] in ("probe", "transport", "scenarios"):
            continue  # (the probe and the wire never load the model: pyproject's import contracts)
        for cls, fn, target in _writes(ast.parse(path.read_text())):
            if rel == "model/state.py" and cls == "Model" and fn in ("__init__", "reset"):
                continue  # its fields made, and made afresh for a new job
            if (rel, target) not in NOT_THE_MODEL:
                found.append(f"{rel}: {cls or ''}.{fn}: {target}")
    assert found == []


def test_the_scan_sees_a_write_through_a_field_of_a_rank():
    """The test above is not blind: a batch path that counts on its own is caught, and
    so is a model rewritten whole or by name, or written through a local name for one
    of its tables."""
    code = ("def _sums(model, p):\n    r = p.states[0]\n    r.per_group[k][0] += 1\n    model.events += 2\n"
            "    model.__dict__.update(other.__dict__)\n    setattr(r, 'seqs', {})\n"
            "    stats = model.stats\n    stats[k] = v\n    seqs = r.seqs\n    seqs.pop(g)\n"
            "    del stats[k]\n")
    assert [t for *_, t in _writes(ast.parse(code))] == [
        "r.per_group", "model.events", "model.__dict__", "setattr(r, 'seqs', {})",
        "stats = model.stats", "seqs = r.seqs", "stats = model.stats"]


def test_the_scan_lets_a_function_read_a_table_and_use_its_own_names():
    """A name bound to a field only in another function, a copy of a table, and a name
    rebound after reading are not writes of the model."""
    code = ("def reads(model):\n    stats = model.stats\n    return len(stats)\n"
            "def own(x):\n    stats = {}\n    stats[1] = 2\n"
            "def copies(model):\n    seqs = dict(model.ranks[0].seqs)\n    seqs[1] = 2\n"
            "    n = model.events\n    n += 1\n")
    assert list(_writes(ast.parse(code))) == []


def test_the_ledger_is_where_one_event_and_a_batch_write_the_same_counts():
    """Both paths of the one writer, side by side: the same events, one at a time and
    as one batch, leave the same counts."""
    events = [(r, hello(r)) for r in (0, 1)] + [(r, group()) for r in (0, 1)]
    for seq in range(300):
        for r in (0, 1):
            events += [(r, ev) for ev in op(seq, 100 + 10 * seq, 105 + 10 * seq, seq=seq, nbytes=64)]
    one, many = Model(), Model()
    for r, ev in events:
        ledger.ingest_one(one, r, ev)
    assert many.ingest([r for r, _ in events], [ev for _, ev in events]) == len(events)
    for m in (one, many):
        assert [(r.ops_done, r.bytes_done, r.per_group, r.seqs) for r in m.ranks.values()] == [
            (300, 300 * 64, {("all_reduce", "0"): [300, 300 * 64]}, {"0": 299})] * 2
