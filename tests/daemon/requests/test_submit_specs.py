"""From a submit request to its jobs' specs: the config's defaults for what the request
left out, the request's own values where it gave them, names and array indices."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from typing import Any

import anyio

from supervisor.core.jobs import JobSpec
from supervisor.daemon.config import RetriesConfig, WatchdogConfig
from supervisor.daemon.programs import Lookups
from supervisor.daemon.requests.submit_specs import job_specs
from supervisor.wire.protocol import Submit, SubmitOptions

RETRIES = RetriesConfig(ordinary=4, gpu_hang=9)
WATCHDOG = WatchdogConfig(progress_timeout_s=600.0, stall_timeout_s=120.0)


def submit(*argvs: tuple[str, ...], names: tuple[str, ...] | None = None, **opts: Any) -> Submit:
    return Submit(argvs, SubmitOptions(cwd="/w", env={"E": "1"}, **opts), names=names)


def specs(req: Submit, watchdog: WatchdogConfig = WATCHDOG) -> list[JobSpec]:
    opts = req.options
    look = Lookups().mem_keys(req.argvs, opts.mem_key, opts.cwd, opts.env.get("PATH"))
    keys = anyio.run(lambda: look)
    return job_specs(req, keys, 1001, 1002, RETRIES, watchdog)


def test_what_the_request_left_out_comes_from_the_config() -> None:
    [spec] = specs(submit(("python", "t.py"), mem_key="k"))
    assert spec == JobSpec(
        argv=("python", "t.py"),
        cwd="/w",
        env={"E": "1"},
        owner_uid=1001,
        owner_gid=1002,
        mem_key="k",
        retries=4,
        gpu_hang_retries=9,
        progress_timeout_s=600.0,
        stall_timeout_s=120.0,
    )


def test_what_the_request_gave_wins_zero_included() -> None:
    [spec] = specs(
        submit(
            ("a",), mem_key="k", name="n", labels={"l": "v"}, gpus=2, vram_mb=100, mem_mb=200,
            mem_scale=1.5, retries=0, gpu_hang_retries=0, progress_timeout_s=5.0,
            progress_regex="step", priority=-3, after=(4, 5), stall_timeout_s=7.0,
            time_limit_s=60.0, share=True,
        )
    )  # fmt: skip
    assert (spec.retries, spec.gpu_hang_retries) == (0, 0)
    assert (spec.progress_timeout_s, spec.stall_timeout_s, spec.time_limit_s) == (5.0, 7.0, 60.0)
    assert (spec.name, spec.labels, spec.gpus, spec.vram_mb, spec.mem_mb) == (
        "n", {"l": "v"}, 2, 100, 200,
    )  # fmt: skip
    assert (spec.mem_scale, spec.progress_regex, spec.priority, spec.after, spec.share) == (
        1.5, "step", -3, (4, 5), True,
    )  # fmt: skip
    assert (spec.array_index, spec.max_running, spec.array_id) == (None, None, None)


def test_a_stall_timeout_of_zero_is_off() -> None:
    [own_zero] = specs(submit(("a",), stall_timeout_s=0.0))
    assert own_zero.stall_timeout_s is None
    [default_zero] = specs(submit(("a",)), replace(WATCHDOG, stall_timeout_s=0.0))
    assert default_zero.stall_timeout_s is None


def test_the_memory_key_defaults_to_the_program() -> None:
    [a, b] = specs(submit(("sh", "train.sh", "--lr", "1"), ("sh", "eval.sh")))
    assert a.mem_key.split("#")[0].endswith("train.sh --lr N")
    assert b.mem_key.split("#")[0].endswith("eval.sh")
    assert a.mem_key != b.mem_key


def test_the_program_is_found_on_the_jobs_path_and_the_script_in_its_cwd() -> None:
    # /w is the requests' working directory: `sh train.sh` there runs /w/train.sh.
    [a, b, c] = specs(submit(("sh", "train.sh"), ("sh", "/w/train.sh"), ("sh", "/x/train.sh")))
    assert a.mem_key == b.mem_key != c.mem_key
    [found] = specs(submit(("sh", "x.sh")))
    sh = shutil.which("sh")
    assert sh is not None
    [given] = specs(submit((os.path.realpath(sh), "x.sh")))
    assert found.mem_key == given.mem_key


def test_a_batch_gets_its_names_one_per_line() -> None:
    out = specs(submit(("a",), ("b",), names=("first", "second"), name="ignored"))
    assert [(s.argv, s.name) for s in out] == [(("a",), "first"), (("b",), "second")]
    assert [s.name for s in specs(submit(("a",), ("b",), name="both"))] == ["both", "both"]


def test_an_array_carries_its_indices_and_cap() -> None:
    out = specs(submit(("x",), ("x",), ("x",), array=(0, 5, 10), max_running=2))
    assert [(s.array_index, s.max_running) for s in out] == [(0, 2), (5, 2), (10, 2)]


def test_a_capped_batch_is_an_array_of_its_lines() -> None:
    out = specs(submit(("a",), ("b",), max_running=1))
    assert [(s.array_index, s.max_running) for s in out] == [(0, 1), (1, 1)]


def test_over_limit_warnings_name_their_jobs_once_per_message() -> None:
    from supervisor.core.records import Event
    from supervisor.daemon.requests.intake import warnings

    big, other = Event("mem_over_limit", "needs ~64 GiB"), Event("mem_over_limit", "needs ~90 GiB")
    notes = ((big,), (), (big,), (other,))
    assert warnings(notes, [7, 8, 9, 10]) == ["jobs 7, 9: needs ~64 GiB", "job 10: needs ~90 GiB"]
    assert warnings(notes, None) == ["needs ~64 GiB", "needs ~90 GiB"]  # a dry run: no ids
    many = tuple((big,) for _ in range(8))
    assert warnings(many, list(range(1, 9))) == ["jobs 1, 2, 3, 4, 5 and 3 more: needs ~64 GiB"]


def test_a_batch_keys_each_command_as_a_submit_of_it_alone_would() -> None:
    batch = [("python", "a.py"), ("python", "b.py"), ("python", "a.py"), ("sh", "-c", "x")]
    keys = [spec.mem_key for spec in specs(submit(*batch))]
    assert keys == [specs(submit(argv))[0].mem_key for argv in batch]
    assert keys[0] == keys[2] and len(set(keys)) == 3
