"""One attempt from launch to its recorded end: spawn, watch, classify, retry.

The decisions (exit classification, retry policy) are pure functions in jobs.py and
retry.py; this module gathers the facts, carries out the decisions and persists them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import structlog

from supervisor.core import retry
from supervisor.core.jobs import ExitStatus, FailureReason, Job, JobState, classify_exit, transition
from supervisor.core.projection import MemObservation
from supervisor.daemon import joblogs, oom
from supervisor.daemon.clock import now_iso
from supervisor.daemon.runner import LaunchSpec, ProcessTable, SpawnError, spawn
from supervisor.daemon.scheduler import Running, Scheduler
from supervisor.daemon.store import Event
from supervisor.gpus import apply_visibility

log = structlog.get_logger("gpusvd.attempts")


def _user_of(uid: int) -> tuple[dict[str, str], int | None, int | None, tuple[int, ...] | None]:
    """The identity a job runs with: a root daemon becomes the submitter; a non-root
    daemon can only run jobs as itself, and the server accepts only its own uid."""
    if os.geteuid() != 0 or uid == os.geteuid():
        return {}, None, None, None
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:  # never fall back to root's identity; nor guess one
        raise SpawnError(f"uid {uid} has no passwd entry: cannot set up its groups") from None
    groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
    env = {"HOME": entry.pw_dir, "USER": entry.pw_name, "LOGNAME": entry.pw_name}
    return env, uid, entry.pw_gid, groups


class AttemptRunner:
    def __init__(
        self,
        sched: Scheduler,
        *,
        logs_dir: Path,
        visibility_env: Callable[[tuple[int, ...]], dict[str, str]],
        abort: Callable[[Callable[[], Any], str], Any],
        oom_evidence: Callable[[Running, ExitStatus], str | None],
        hang_evidence: Callable[[Running], dict[str, Any] | None],
        wait_for_fault: Callable[[Running], Awaitable[dict[str, Any] | None]],
        oom_kills_now: Callable[[], int | None] = lambda: None,
        on_end: Callable[[Job, Running], None] | None = None,
    ) -> None:
        self.sched = sched
        self.store = sched.store
        self.cfg = sched.cfg
        self.logs_dir = logs_dir
        self.visibility_env = visibility_env
        self.uuids_of: Callable[[tuple[int, ...]], tuple[str, ...]] = lambda cards: ()
        self.abort = abort
        self.oom_evidence = oom_evidence
        self.hang_evidence = hang_evidence
        self.wait_for_fault = wait_for_fault
        self.oom_kills_now = oom_kills_now
        self.oom_base = oom.base_value(oom.read_value() or 0)
        self.on_end = on_end

    def log_paths(self, job_id: int) -> tuple[Path, Path]:
        return self.logs_dir / f"{job_id}.out", self.logs_dir / f"{job_id}.err"

    def _launch_spec(self, job: Job, r: Running) -> LaunchSpec:
        user_env, uid, gid, groups = _user_of(job.spec.owner_uid)
        env = apply_visibility({**job.spec.env, **user_env}, self.visibility_env(r.cards))
        env["GPUSV_JOB_ID"] = str(job.id)
        env["GPUSV_ATTEMPT"] = str(r.attempt.n)
        if self.cfg.logs.python_unbuffered:  # so that `logs -f` is live for Python jobs
            env.setdefault("PYTHONUNBUFFERED", "1")
        out, err = self.log_paths(job.id)
        if r.attempt.n > 1:  # where one attempt's output ends and the next one's starts
            joblogs.append((out, err), joblogs.header(job.id, r.attempt.n, r.attempt.started_at))
        return LaunchSpec(
            job_id=job.id,
            attempt=r.attempt.n,
            argv=job.spec.argv,
            cwd=job.spec.cwd,
            env=env,
            stdout=out,
            stderr=err,
            uid=uid,
            gid=gid,
            groups=groups,
            oom_score_adj=oom.NEWEST,
        )

    async def launch(self, job: Job, r: Running) -> None:
        """Persist the attempt, start it, wait for it, record its end."""
        r.attempt = dataclasses.replace(r.attempt, gpu_uuids=self.uuids_of(r.cards))
        at = r.attempt.started_at
        started = transition(job, JobState.RUNNING, at, gpus=r.cards, attempts=r.attempt.n)
        gpus = ",".join(map(str, r.cards)) or "none"
        await self.store.save(
            started,
            at,
            Event("started", f"attempt {r.attempt.n} on GPUs {gpus}", {"gpus": list(r.cards)}),
            new_attempt=r.attempt,
        )
        self.sched.put(started)
        try:
            handle = await anyio.to_thread.run_sync(spawn, self._launch_spec(started, r))
        except SpawnError as exc:
            await self.finish(started, r, None, spawn_error=str(exc))
            return
        r.handle = handle
        r.oom_kills_at_start = self.oom_kills_now()
        r.attempt = dataclasses.replace(r.attempt, pid=handle.pid, pid_start=handle.start_time)
        self.rank()
        # For recovery only (a restart kills a leftover by pid): not worth a commit's wait.
        assert self.sched.tg is not None
        self.sched.tg.start_soon(self._record_pid, r)
        if r.kill_reason is not None:  # cancelled or drained while we were starting it
            await self.stop(r, r.kill_reason, r.evidence)
        status = await handle.wait()
        await self.finish(self.sched.jobs.get(job.id, started), r, status)

    async def _record_pid(self, r: Running) -> None:
        try:
            await self.store.set_attempt_pid(r.attempt)
        except Exception as exc:  # the job runs on; only a restart would miss the pid
            log.warning("cannot record the pid", job_id=r.job_id, error=repr(exc))

    def rank(self) -> None:
        """Newest dispatched job's tree at 1000, every other job's at the base value, so
        the kernel kills the newest first; re-run when the newest ends (the next newest
        is promoted) and after each dispatch (the new job set its own value before exec)."""
        handles = {r.job_id: r.handle for r in self.sched.running.values() if r.handle}
        if not handles:
            return
        table = ProcessTable()  # one read of /proc for every job's tree
        trees = {job_id: [p.pid for p in h.tree(table)] for job_id, h in handles.items()}
        newest = oom.newest_job(
            {r.job_id: r.seq for r in self.sched.running.values() if r.job_id in trees}
        )
        assert newest is not None
        others = {job: pids for job, pids in trees.items() if job != newest}
        values = oom.oom_adjustments(trees[newest], others, base=self.oom_base)
        failures = oom.apply(values)
        if failures:
            log.debug("oom_score_adj not applied", failures=failures[:5])

    async def stop(
        self,
        r: Running,
        reason: FailureReason,
        evidence: dict[str, Any] | None = None,
        after_kill: Callable[[], Any] | None = None,
    ) -> None:
        """Kill an attempt's tree for `reason` (then run `after_kill`, e.g. re-probe its
        card), all on one abort thread under the deadman; the watcher records the end."""
        if r.kill_reason is None or reason is FailureReason.GPU_HANG:
            r.kill_reason = reason
            r.evidence = evidence
        if r.handle is None or r.aborting:
            return
        r.aborting = True
        handle = r.handle
        grace = self.cfg.jobs.kill_grace_s

        def abort() -> None:
            handle.kill_tree(grace)
            if after_kill is not None:
                after_kill()

        with contextlib.suppress(Exception):  # a failed re-probe is the monitor's to see
            await self.abort(abort, f"job-{r.job_id}")

    async def _reason(
        self, r: Running, status: ExitStatus | None
    ) -> tuple[FailureReason | None, dict[str, Any] | None]:
        if status is None:
            return FailureReason.SPAWN_FAILED, None
        if r.kill_reason is not None:
            return r.kill_reason, r.evidence
        if classify_exit(status) is None:  # a success stands, whatever the log said
            return None, None
        hang = self.hang_evidence(r)
        if hang is None and r.cards:
            hang = await self.wait_for_fault(r)
            if r.kill_reason is not None:  # the line arrived and its abort claimed the job
                return r.kill_reason, r.evidence
        oom_why = self.oom_evidence(r, status)
        reason = classify_exit(status, oom_evidence=oom_why is not None, hang_evidence=bool(hang))
        if reason is FailureReason.GPU_HANG:
            return reason, hang
        if reason is FailureReason.OOM_KILLED:
            return reason, {"source": oom_why}
        return reason, None

    async def finish(
        self, job: Job, r: Running, status: ExitStatus | None, spawn_error: str | None = None
    ) -> None:
        reason, evidence = await self._reason(r, status)
        if spawn_error:
            evidence = {"message": spawn_error}
        if r.handle is not None and r.handle.tree():  # descendants outlived the leader
            handle = r.handle
            with contextlib.suppress(Exception):
                await self.abort(lambda: handle.kill_tree(0.5), f"job-{job.id}-leftovers")
        at = now_iso()
        ended = dataclasses.replace(
            r.attempt,
            ended_at=at,
            exit_code=status.exit_code if status else None,
            signal=status.signal if status else None,
            reason=reason.value if reason else None,
            peak_rss_mb=r.peak_rss_mb or None,
            evidence=evidence,
        )
        if r.peak_rss_mb:
            self.sched.observe(
                job.spec.mem_key,
                MemObservation(r.peak_rss_mb, ended.reason, job.spec.mem_scale, ended.peak_vram_mb),
            )
        final, events = self.decide(job, reason, status, spawn_error)
        await self.store.save(final, at, events, ended_attempt=ended)
        r.attempt = ended
        newest = oom.newest_job({j.job_id: j.seq for j in self.sched.running.values()})
        self.sched.running.pop(job.id, None)
        if newest == job.id:  # the next newest is promoted; otherwise the order stands
            self.rank()
        self.sched.put(final)
        if self.on_end is not None:
            self.on_end(final, r)

    def decide(
        self,
        job: Job,
        reason: FailureReason | None,
        status: ExitStatus | None,
        spawn_error: str | None,
    ) -> tuple[Job, list[Event]]:
        at = now_iso()
        code = status.shell_code if status else None
        if reason is None:
            done = transition(job, JobState.SUCCEEDED, at, None, exit_code=0)
            return done, [Event("exited", "exited 0", {"exit_code": 0})]
        limit = job.spec.time_limit_s
        message = spawn_error or (
            f"past its wall-time limit of {limit:g}s"
            if reason is FailureReason.TIMEOUT and limit
            else f"exit code {status.exit_code}"
            if status and status.exit_code is not None
            else f"killed by signal {status.signal}"
            if status
            else reason.value
        )
        events = [Event("exited", f"{reason.value}: {message}", {"reason": reason.value})]
        if reason is FailureReason.GPU_HANG:
            events.insert(0, Event("gpu_hang", "attempt failed as gpu_hang"))
        if reason is FailureReason.CANCELLED:
            events.append(Event("cancelled", "cancelled while running"))
            return transition(job, JobState.CANCELLED, at, reason, exit_code=code), events
        if reason is FailureReason.INTERRUPTED:
            events.append(Event("interrupted", "interrupted by a daemon stop; requeued"))
            return transition(job, JobState.QUEUED, at, reason), events
        action = retry.next_action(
            reason,
            ordinary_used=job.ordinary_used,
            ordinary_budget=job.spec.retries,
            gpu_hang_used=job.gpu_hang_used,
            gpu_hang_budget=job.spec.gpu_hang_retries,
        )
        if isinstance(action, retry.Fail):
            return transition(job, JobState.FAILED, at, reason, exit_code=code), events
        used = {
            "ordinary_used": job.ordinary_used + (action.charge == "ordinary"),
            "gpu_hang_used": job.gpu_hang_used + (action.charge == "gpu_hang"),
        }
        queued = transition(
            job, JobState.QUEUED, at, reason, not_before=time.time() + action.delay_s, **used
        )
        events.append(
            Event(
                "retry_scheduled",
                f"retry in {action.delay_s:.0f}s ({action.charge} budget)",
                {"budget": action.charge, "delay_s": action.delay_s},
            )
        )
        return queued, events
