"""A service's process leaves with its main's exit code at once (``services.common.prompt_exit``), what it printed
flushed; a message in a ``SystemExit`` is written and exits 1; an exception escaping main is a traceback, as ever."""

from __future__ import annotations

import subprocess
import sys

import pytest

from services.engine_node.serve import ENGINE_FAILED_EXIT_CODE


def _run(body: str) -> subprocess.CompletedProcess[str]:
    script = f"from services.common.prompt_exit import exit_after\nprint('said', end='')\n{body}\n"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("body", "code", "stderr"), [
    ("exit_after(lambda: 0)", 0, ""),
    ("exit_after(lambda: None)", 0, ""),
    (f"exit_after(lambda: {ENGINE_FAILED_EXIT_CODE})", ENGINE_FAILED_EXIT_CODE, ""),
    ("def main():\n    raise SystemExit(2)\nexit_after(main)", 2, ""),
    ("def main():\n    raise SystemExit('error: the port is taken')\nexit_after(main)", 1,
     "error: the port is taken\n"),
])
def test_the_process_leaves_with_mains_code_and_its_output_flushed(body, code, stderr):
    done = _run(body)
    assert (done.returncode, done.stdout, done.stderr) == (code, "said", stderr)


def test_an_exception_escaping_main_is_a_traceback():
    done = _run("def main():\n    raise RuntimeError('a bug')\nexit_after(main)")
    assert done.returncode == 1 and done.stdout == "said" and "RuntimeError: a bug" in done.stderr
