"""How `gpusv logs` prints both streams (client/logview.py)."""

from __future__ import annotations

import io
import json

from supervisor.client.logview import View, marking


def _view(as_json: bool, mark: str) -> tuple[View, io.BytesIO]:
    out = io.BytesIO()
    return View(out, as_json=as_json, mark=mark), out


def test_stderr_lines_are_prefixed_in_a_file_and_stdout_is_as_written() -> None:
    view, out = _view(as_json=False, mark="prefix")
    view.write("stdout", b"one\n")
    view.write("stderr", b"Trace")  # a line in two writes gets one mark
    view.write("stderr", b"back\n  line\n")
    view.write("stdout", b"two\n")
    view.close()
    assert out.getvalue() == b"one\n[stderr] Traceback\n[stderr]   line\ntwo\n"


def test_on_a_terminal_stderr_is_red_and_one_stream_alone_is_unmarked() -> None:
    view, out = _view(as_json=False, mark="color")
    view.write("stderr", b"err\n")
    assert out.getvalue() == b"\x1b[31merr\x1b[0m\n"
    view, out = _view(as_json=False, mark="none")
    view.write("stderr", b"err\n")
    assert out.getvalue() == b"err\n"
    assert marking(True, {"TERM": "xterm"}) == "color"
    assert marking(True, {"TERM": "xterm", "NO_COLOR": "1"}) == "prefix"
    assert marking(False, {"TERM": "xterm"}) == "prefix"


def test_json_is_one_object_a_whole_line_and_the_rest_at_the_end() -> None:
    view, out = _view(as_json=True, mark="prefix")
    view.write("stdout", b"a\nb")
    view.write("stderr", b"e\xff\n")
    view.write("gpusv", b"\n--- gpusv: job 1, attempt 2 ---\n")
    view.write("stdout", b"c\n")
    view.write("stdout", b"tail")
    view.close()
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert lines == [
        {"stream": "stdout", "line": "a"},
        {"stream": "stderr", "line": "e\ufffd"},
        {"stream": "gpusv", "line": "--- gpusv: job 1, attempt 2 ---"},
        {"stream": "stdout", "line": "bc"},
        {"stream": "stdout", "line": "tail"},
    ]
