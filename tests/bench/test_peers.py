"""The peers' table: medians, ratios to the best peer, a skipped peer said as such."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from bench import harness, peers


def _gpusv(rate: float) -> dict[str, Any]:
    return {
        "jobs": 100,
        "jobs_per_s": rate,
        "machine_cpu_s": 0.5,
        "daemon_cpu_ms_per_job": 0.4,
        "keeper_cpu_ms_per_job": 0.3,
    }


def test_medians_and_ratios_against_the_best_peer() -> None:
    rounds = {
        "gpusv": [_gpusv(600), _gpusv(400), _gpusv(500)],
        "tsp": [{"jobs": 100, "jobs_per_s": 250, "machine_cpu_s": 1.0}],
        "hyperqueue": [{"jobs": 100, "jobs_per_s": 400, "machine_cpu_s": 2.0}],
        "floor": [{"jobs": 100, "jobs_per_s": 2000, "machine_cpu_s": 0.2}],
    }
    s = peers.summarise(rounds)
    assert s["gpusv"]["jobs_per_s"] == 500
    assert s["gpusv"]["machine_cpu_ms_per_job"] == 5.0
    assert s["ratios"] == {"gpusv/tsp": 2.0, "gpusv/hyperqueue": 1.25, "gpusv/best_peer": 1.25}
    text = peers.table(s)
    assert "gpusv             500         1.25" in text
    assert "daemon 0.40 ms/job, keepers 0.30 ms/job" in text
    assert "floor            2000         5.00" in text


def test_a_skipped_peer_is_said_and_left_out_of_the_ratios() -> None:
    rounds: dict[str, list[dict[str, Any]]] = {
        "gpusv": [_gpusv(300)],
        "tsp": [{"jobs": 100, "jobs_per_s": 200, "machine_cpu_s": 1.0}],
        "hyperqueue": [{"skipped": "hyperqueue could not be installed"}],
        "floor": [],
    }
    s = peers.summarise(rounds)
    assert s["ratios"] == {"gpusv/tsp": 1.5, "gpusv/best_peer": 1.5}
    text = peers.table(s)
    assert "hyperqueue could not be installed" in text
    assert "floor" in text and "not run" in text


def test_the_floor_starts_every_process() -> None:
    floor = peers.measure_floor(20)
    assert floor["jobs"] == 20 and floor["jobs_per_s"] > 0


def test_the_machine_s_cpu_counts_niced_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """/proc/stat keeps a niced process's time apart from `user`: a peer may nice its
    workers, and its figures would then leave their CPU out."""
    kind = type(psutil.cpu_times())
    fields = dict.fromkeys(kind._fields, 0.0)
    fields.update(user=1.0, nice=2.0, system=0.5, idle=100.0)
    monkeypatch.setattr(psutil, "cpu_times", lambda: kind(**fields))
    assert harness.machine_cpu_s() == 3.5


def test_the_machine_is_described_by_its_cpu_and_a_timed_python_loop() -> None:
    assert 0 < peers.python_ms(100_000) < peers.python_ms(2_000_000)
    assert peers.cpu_model() not in ("", "unknown")  # /proc/cpuinfo names it on Linux


def test_gpusv_on_a_second_interpreter_is_a_row_of_its_own() -> None:
    rounds = {
        "gpusv": [_gpusv(500)],
        "gpusv@/usr/bin/python3": [_gpusv(600)],
        "tsp": [{"jobs": 100, "jobs_per_s": 400, "machine_cpu_s": 1.0}],
        "hyperqueue": [{"jobs": 100, "jobs_per_s": 300, "machine_cpu_s": 2.0}],
        "floor": [],
    }
    s = peers.summarise(rounds)
    assert s["ratios"]["gpusv/best_peer"] == 1.25
    assert s["ratios"]["gpusv@/usr/bin/python3/best_peer"] == 1.5
    assert s["ratios"]["gpusv@/usr/bin/python3/hyperqueue"] == 2.0
    lines = peers.table(s).splitlines()
    assert lines[1].split()[:3] == ["gpusv", "500", "1.25"]
    assert lines[2].split()[:3] == ["gpusv@/usr/bin/python3", "600", "1.50"]
    assert [line.split()[0] for line in lines[3:]] == ["tsp", "hyperqueue", "floor"]


def test_an_interpreter_is_described_as_it_runs() -> None:
    facts = peers.interpreter(Path(sys.executable))
    assert facts["version"] == sys.version.split()[0]
    assert facts["executable"] == str(Path(sys.executable).resolve())
    shared = any("libpython" in line for line in Path("/proc/self/maps").read_text().splitlines())
    assert facts["libpython_shared"] is shared
    assert facts["loop_ms"] > 0
    assert facts["version"] in peers.describe(facts)
    broken = peers.interpreter(Path("/bin/false"))
    assert "error" in broken and "not described" in peers.describe(broken)


def test_an_interpreter_with_no_environment_is_refused_before_any_round(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        peers.main(["--gpusv-python", str(tmp_path / "none"), "--out", str(tmp_path / "o.json")])
    assert exited.value.code == 2 and "no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        peers.main(["--gpusv-python", "/bin/false", "--out", str(tmp_path / "o.json")])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "no environment could be made with it" in err
    assert not (tmp_path / "o.json").exists()
