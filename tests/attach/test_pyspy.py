"""py-spy's output read as the probe's stacks; its refusals said with the fix."""

import json
import os
import stat

import pytest

from commviz.attach import pyspy

DUMP = [{"thread_name": "MainThread", "active": False, "frames": [
    {"name": "send", "filename": "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
     "line": 2750, "locals": [{"name": "dst", "repr": "3"}, {"name": "group", "repr": "None"}]},
    {"name": "Trainer.step", "filename": "/home/me/train.py", "line": 40, "locals": []},
    {"name": "<module>", "filename": "/home/me/train.py", "line": 90}]}]


def test_frames_come_outermost_first_with_their_locals():
    [t] = pyspy.parse(json.dumps(DUMP))
    assert [(f.function, f.line) for f in t.frames] == [("<module>", 90), ("step", 40), ("send", 2750)]
    assert t.locals[2] == {"dst": "3", "group": "None"} and t.name == "MainThread"


def fake_exe(tmp_path, script: str) -> str:
    p = tmp_path / "py-spy"
    p.write_text("#!/bin/sh\n" + script)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


def test_a_ptrace_refusal_says_how_to_allow_it(tmp_path):
    exe = fake_exe(tmp_path, 'echo "Error: Permission Denied: Operation not permitted (os error 1)" >&2; exit 1\n')
    with pytest.raises(pyspy.AttachError) as e:
        pyspy.dump(os.getpid(), exe)
    assert "ptrace refused" in str(e.value) and "ptrace_scope" in str(e.value) and "SYS_PTRACE" in str(e.value)


def test_no_pyspy_names_the_extra(monkeypatch):
    monkeypatch.setattr(pyspy, "find_pyspy", lambda: None)
    with pytest.raises(pyspy.AttachError, match=r"commviz\[attach\]"):
        pyspy.dump(1)


def test_output_that_is_not_json_is_an_error_not_a_crash(tmp_path):
    with pytest.raises(pyspy.AttachError, match="not JSON"):
        pyspy.dump(1, fake_exe(tmp_path, "echo garbage\n"))
