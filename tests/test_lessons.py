"""The course: every scenario is a lesson the package carries, listed with what it
teaches, and `commviz lesson NAME` runs it under the dashboard."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import pytest

from commviz import lessons
from commviz.cli import main

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.stem for p in (ROOT / "scenarios").glob("*.py") if not p.name.startswith("_"))


def test_every_scenario_is_a_lesson_with_one_line_of_what_it_teaches():
    course = lessons.lessons()
    assert sorted(lesson.name for lesson in course) == SCRIPTS
    assert course[0].name == "allreduce"  # `commviz demo` runs the first one
    for lesson in course:
        assert lesson.teaches and "\n" not in lesson.teaches, lesson.name
        assert os.path.exists(lesson.path)
    assert lessons.find("hang").hang_after_s < 10  # the hang lessons get to the point
    assert lessons.find("scenarios/p2p.py").name == "p2p"


def test_an_unknown_lesson_names_the_close_ones():
    with pytest.raises(lessons.UnknownLesson, match="did you mean allreduce"):
        lessons.find("allredcue")


def test_a_new_script_is_a_lesson_after_the_course(tmp_path):
    (tmp_path / "_common.py").write_text("")
    (tmp_path / "allreduce.py").write_text('"""all_reduce: the sum.\n\nMore."""\n')
    (tmp_path / "zeta.py").write_text('"""Zeta: something new,\nsaid over two lines.\n\n    torchrun zeta.py\n"""\n')
    (tmp_path / "broken.py").write_text("def (:\n")
    course = lessons.lessons(str(tmp_path))
    assert [(c.name, c.teaches) for c in course] == [
        ("allreduce", "all_reduce: the sum."), ("broken", ""), ("zeta", "Zeta: something new, said over two lines.")]


def test_the_wheel_carries_the_scenarios(monkeypatch):
    """What setuptools puts in the wheel (build_py's file list, from pyproject.toml)."""
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    monkeypatch.chdir(ROOT)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dist = apply_configuration(Distribution({"script_name": "setup.py"}), "pyproject.toml")
        build = dist.get_command_obj("build_py")
        build.ensure_finalized()
        files = {Path(f).relative_to(build.build_lib).as_posix() for f in build.get_outputs(include_bytecode=False)}
    assert {f"commviz/scenarios/{name}.py" for name in SCRIPTS + ["_common"]} <= files


def test_lesson_lists_the_course(capsys):
    assert main(["lesson"]) == 0
    out = capsys.readouterr().out
    for name in SCRIPTS:
        assert f"  {name} " in out
    assert "commviz lesson allreduce" in out


def test_lesson_runs_the_script_under_the_dashboard(monkeypatch):
    """torchrun on the lesson's script, its watching flags, then the user's own."""
    from commviz.commands import lesson as lesson_cmd

    seen = {}

    def fake_watch(cmd, topology=None, hang_after_s=10.0, title=""):
        seen.update(cmd=cmd, topology=topology, hang=hang_after_s, title=title)
        return 0

    monkeypatch.setattr(lesson_cmd, "watch", fake_watch)
    assert main(["lesson", "hang", "--nproc", "3", "--topology", "dgx-h100", "--", "--skip-at", "1"]) == 0
    cmd = seen["cmd"]
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"] and "--nproc-per-node=3" in cmd
    assert cmd[cmd.index(lessons.find("hang").path) + 1:] == [*lessons.find("hang").args, "--skip-at", "1"]
    assert seen["topology"] == "dgx-h100" and seen["hang"] == 3.0 and seen["title"] == "commviz lesson hang"
    seen.clear()
    assert main(["demo", "--nproc", "2"]) == 0
    assert seen["title"] == "commviz lesson allreduce" and lessons.find("allreduce").path in seen["cmd"]


def test_lesson_unknown_exits_with_the_fix(capsys):
    assert main(["lesson", "nope"]) != 0
    assert "`commviz lesson` lists them" in capsys.readouterr().err
