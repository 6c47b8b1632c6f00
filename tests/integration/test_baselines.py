"""A plain baseline gets a second run only for torch's own abort at exit, and only one:
anything else, or the same abort twice, is the test's failure to report."""

import sys

from tests.integration.conftest import TORCH_EXIT_ABORT, run_plain


def _job(tmp_path, aborts: int, message: str = TORCH_EXIT_ABORT) -> list[str]:
    """A job that dies with `message` on its first `aborts` runs, then succeeds."""
    runs = tmp_path / "runs"
    code = (f"import pathlib, sys; f = pathlib.Path({str(runs)!r}); n = len(f.read_text()) if f.exists() else 0; "
            f"f.write_text('x' * (n + 1)); sys.stderr.write({message!r} if n < {aborts} else ''); "
            f"sys.exit(134 if n < {aborts} else 0)")
    return [sys.executable, "-c", code]


def runs_made(tmp_path) -> int:
    return len((tmp_path / "runs").read_text())


def test_a_baseline_torch_aborted_at_exit_runs_once_more(tmp_path):
    assert run_plain(_job(tmp_path, aborts=1)).returncode == 0
    assert runs_made(tmp_path) == 2


def test_a_baseline_that_aborts_twice_fails(tmp_path):
    assert run_plain(_job(tmp_path, aborts=2)).returncode == 134
    assert runs_made(tmp_path) == 2


def test_a_baseline_that_fails_otherwise_is_not_run_again(tmp_path):
    assert run_plain(_job(tmp_path, aborts=1, message="Traceback: ValueError")).returncode == 134
    assert runs_made(tmp_path) == 1
