"""The engine's step: every change of a job's state is decided here, and only here.

`step(table, command, now)` reads the table and returns what changes (applied with
`Table.apply` once committed), the writes to commit in one transaction, and the actions
for the shell to perform after the commit. Pure: no I/O, no clock (time is `now`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from supervisor.core import outcome
from supervisor.core.admission import Hold, Start
from supervisor.core.commands import (
    AttemptEnded,
    Cancel,
    Changed,
    Command,
    Dispatch,
    Ended,
    Forget,
    HangSeen,
    HoldJob,
    InsertJob,
    Kill,
    MarkCleaned,
    Now,
    ProcessStarted,
    Progress,
    Reclassify,
    RecordStop,
    Recover,
    SaveJob,
    SetPid,
    Spawn,
    Spawning,
    Started,
    Stop,
    SubmitJobs,
    UpdateJob,
)
from supervisor.core.dependencies import expanded, parents, waiting_text
from supervisor.core.draft import Draft, Step, Verdict
from supervisor.core.evolve import evolve
from supervisor.core.hang_record import hang_record
from supervisor.core.jobqueue import DEVICE_HOLD, kind_of
from supervisor.core.jobs import FailureReason, Job, JobState, transition
from supervisor.core.outcome import Facts
from supervisor.core.records import Attempt, Event, iso_at
from supervisor.core.recovery import recover
from supervisor.core.table import Live, Phase, Table, waiting_ahead
from supervisor.core.update import update_job

# ---- the commands -----------------------------------------------------------------------


def _submit(d: Draft, cmd: SubmitJobs) -> None:
    first = d.changes.next_id or d.table.next_id
    d.changes.next_id = first + len(cmd.specs)
    # A new array is named by its first job; a restart's specs already name theirs.
    # A parent of an array stands for all of it: stored spelled out (core/dependencies.py).
    specs = [
        expanded(
            s if s.array_index is None or s.array_id is not None else replace(s, array_id=first),
            cmd.arrays,
        )
        for s in cmd.specs
    ]
    jobs = [Job(id=first + i, spec=s, submitted_at=d.now.iso) for i, s in enumerate(specs)]
    for i, job in enumerate(jobs):
        d.set_job(job)
        d.out.writes.append(InsertJob(job, cmd.notes[i] if i < len(cmd.notes) else ()))
        d.out.actions.append(Changed(None, job))
        if parents(job.spec):
            d.changes.pending[job.id] = frozenset()  # no dispatch before its parents are known
    for job in jobs:
        if parents(job.spec):
            d.track(job, cmd.ended_parents)


def _dispatch(d: Draft, cmd: Dispatch) -> None:
    for hold in cmd.holds:
        _hold(d, hold, cmd.announce)
    for start in cmd.starts:
        _claim(d, start, cmd)
    d.changes.settle += [h.job_id for h in cmd.holds if _settles(d.job(h.job_id), h, cmd.full)]
    d.changes.settle_array += [h.job_id for h in cmd.holds if h.reason == "array" and _queued(d, h)]


def _queued(d: Draft, hold: Hold) -> bool:
    job = d.job(hold.job_id)
    return job is not None and job.state is JobState.QUEUED


def _settles(job: Job | None, hold: Hold, full: frozenset[str]) -> bool:
    """Held for its kind of device while none of it was free: in a pass that began so,
    or (needing one unit) in one that used the last unit up (jobqueue's settled jobs)."""
    if job is None or job.state is not JobState.QUEUED:
        return False
    kind = kind_of(job)
    return hold.reason == DEVICE_HOLD[kind] and (kind in full or job.spec.gpus <= 1)


def _hold(d: Draft, hold: Hold, announce: bool = True) -> None:
    """Show why a job waits; its `queue_wait` event is written once per wait, whatever
    the blocker turns into meanwhile (not yet, where `announce` is False)."""
    job = d.job(hold.job_id)
    if job is None or job.state is not JobState.QUEUED:
        return
    if d.held_since(job.id) is None:
        d.changes.held_since[job.id] = d.now.mono
    if (job.waiting_for, job.hold_reason) != (hold.message, hold.reason):
        job = evolve(job, waiting_for=hold.message, hold_reason=hold.reason)
        d.set_job(job)
    if announce and not d.announced(job.id):
        d.changes.announced.add(job.id)
        d.out.writes.append(
            SaveJob(job, d.now.iso, (Event("queue_wait", hold.message, {"reason": hold.reason}),))
        )


def _claim(d: Draft, start: Start, cmd: Dispatch) -> None:
    job = d.job(start.job_id)
    if job is None or job.state is not JobState.QUEUED or d.pending(job.id) is not None:
        return
    seq = (d.changes.seq if d.changes.seq is not None else d.table.seq) + 1
    d.changes.seq = seq
    attempt = Attempt(
        job_id=job.id,
        n=job.attempts + 1,
        gpus=start.gpus,
        started_at=d.now.iso,
        mem_key=job.spec.mem_key,
        mem_scale=job.spec.mem_scale,
        gpu_uuids=cmd.uuids.get(job.id, ()),
    )
    started = transition(job, JobState.RUNNING, d.now.iso, gpus=start.gpus, attempts=attempt.n)
    gpus = ",".join(map(str, start.gpus)) or "none"
    data: dict[str, object] = {"gpus": list(start.gpus)}
    message = f"attempt {attempt.n} on GPUs {gpus}"
    if start.after is not None:
        data["after"] = start.after[0]
        message += f", starting once job {start.after[0]} exits"
    d.put(started, Event("started", message, data), new=attempt)
    d.changes.live[job.id] = Live(
        attempt=attempt,
        cards=start.gpus,
        seq=seq,
        phase=Phase.CLAIMED,
        projection=cmd.projections.get(job.id),
        vram_reserved_mb=start.vram_reserved_mb,
        claimed_mono=d.now.mono,
        after=start.after,
    )
    d.out.actions.append(Spawn(started, attempt, start.gpus, seq, start.after))


def _spawning(d: Draft, cmd: Spawning) -> None:
    live = d.live(cmd.job_id)
    if live is not None and live.attempt.n == cmd.n and live.phase is Phase.CLAIMED:
        d.changes.live[cmd.job_id] = evolve(live, phase=Phase.SPAWNING)


def _started(d: Draft, cmd: Started) -> None:
    live = d.live(cmd.job_id)
    if live is None or live.attempt.n != cmd.n:
        return
    job_started_at = None
    if live.after is None:
        attempt = evolve(live.attempt, pid=cmd.pid, pid_start=cmd.pid_start)
    else:  # claimed ahead: it starts now, not when it was claimed
        # The keeper's stamp of the start, where it gave one: this step may come after
        # the step that ends the job in front, which stamps that end with its exit.
        at = iso_at(cmd.pid_start) if cmd.pid_start is not None else d.now.iso
        attempt = evolve(live.attempt, pid=cmd.pid, pid_start=cmd.pid_start, started_at=at)
        job = d.job(cmd.job_id)
        if job is not None and job.started_at == live.attempt.started_at:
            job_started_at = at
            d.set_job(evolve(job, started_at=job_started_at))
    d.changes.live[cmd.job_id] = evolve(live, phase=Phase.RUNNING, attempt=attempt)
    d.out.writes.append(SetPid(attempt, job_started_at))
    d.out.actions.append(ProcessStarted(cmd.job_id, cmd.pid))
    if live.kill is not None:  # stopped while it was being started
        d.out.actions.append(Kill(cmd.job_id, None, live.kill_since))


def _ended(d: Draft, cmd: Ended) -> None:
    job, live = d.job(cmd.job_id), d.live(cmd.job_id)
    if job is None or live is None or live.attempt.n != cmd.n:
        return
    facts = cmd.facts
    if live.kill is not None:
        facts = evolve(facts, killed_for=live.kill, kill_evidence=live.evidence)
    if facts.hang is not None and live.machine is None:
        live = evolve(live, machine=facts.machine or {"at": d.now.iso})
    d.end(job, live, facts)


def _stop(
    d: Draft,
    job_id: int,
    reason: FailureReason,
    evidence: dict[str, object] | None,
    reprobe: int | None,
    machine: dict[str, object] | None = None,
) -> None:
    """Kill the attempt for `reason`; one not yet being started ends here and now. A hang
    replaces an earlier reason (it is the cause), but not a user's cancel; otherwise the
    first reason stands."""
    job, live = d.job(job_id), d.live(job_id)
    if job is None or live is None:
        return
    if reason is FailureReason.GPU_HANG and waiting_ahead(live, d.lives()):
        # It never ran on the card: back to the queue, charged to no budget, and not
        # started on a card that is being re-probed.
        reason, reprobe = FailureReason.INTERRUPTED, None
        evidence = {"message": "its card hung before it started; queued again"}
    replaces = reason is FailureReason.GPU_HANG and live.kill not in (
        reason,
        FailureReason.CANCELLED,
    )
    if live.kill is None or replaces:
        since = live.kill_since if live.kill_since is not None else d.now.wall
        live = evolve(
            live, kill=reason, evidence=evidence, machine=machine or live.machine, kill_since=since
        )
        d.changes.live[job_id] = live
    elif live.kill is reason:
        return  # already being stopped for this
    if live.phase is Phase.CLAIMED:  # no process yet, nor will there be
        d.end(job, live, Facts(status=None, killed_for=live.kill, kill_evidence=live.evidence))
        return
    # Committed before the kill is sent or the stop acknowledged: a daemon that dies
    # during the grace leaves its successor the intent, and the moment it began.
    a = live.attempt
    at = Now(live.kill_since or d.now.wall, 0.0).iso
    d.out.writes.append(RecordStop(a.job_id, a.n, reason.value, at, live.evidence))
    if live.phase is Phase.RUNNING or live.after is not None:
        # Started ahead, its keeper holds it back until its predecessor exits: told now,
        # it drops it (or kills it, if it has just started).
        d.out.actions.append(Kill(job_id, reprobe, live.kill_since))


def _cancel(d: Draft, cmd: Cancel) -> None:
    """A queued job ends cancelled now; a running one is stopped and ends cancelled once
    its processes are gone. A job not in the table has ended already: no verdict."""
    job = d.job(cmd.job_id)
    if job is None:
        return
    if job.state is JobState.QUEUED:
        cancelled = transition(job, JobState.CANCELLED, d.now.iso, FailureReason.CANCELLED)
        d.put(cancelled, Event("cancelled", "cancelled while queued"))
        d.out.verdicts[job.id] = Verdict(True, "cancelled")
    elif job.state is JobState.RUNNING:
        _stop(d, job.id, FailureReason.CANCELLED, None, None)
        d.out.verdicts[job.id] = Verdict(True, "cancelling")


def _reclassify(d: Draft, cmd: Reclassify) -> None:
    job = d.job(cmd.job_id)
    fixed = outcome.reclassified(job, cmd.attempt, cmd.evidence) if job else None
    if fixed is None:
        return
    d.put(fixed.job, *fixed.events, end=fixed.attempt)
    d.out.writes.append(hang_record(fixed.job, fixed.attempt, cmd.machine, d.now))
    cards = fixed.attempt.gpus
    d.out.actions.append(AttemptEnded(fixed.job, fixed.attempt, cards))


def _progress(d: Draft, cmd: Progress) -> None:
    job = d.job(cmd.job_id)
    if job is not None and job.progress != cmd.match:
        d.set_job(evolve(job, progress=cmd.match))


def hold_refusal(job: Job, hold: bool) -> str | None:
    """Why `hold` (or `release`) does not apply to this job, or None."""
    if job.state is not JobState.QUEUED:
        return f"is {job.state.value}; only a queued job can be {'held' if hold else 'released'}"
    if job.held == hold:
        return "is already held" if hold else "is not held"
    return None


def _hold_job(d: Draft, cmd: HoldJob) -> None:
    """Hold or release a queued job: it keeps its place; while held it does not start.
    A job not in the table has ended already: no verdict."""
    job = d.job(cmd.job_id)
    if job is None:
        return
    why = hold_refusal(job, cmd.held)
    if why is not None:
        d.out.verdicts[job.id] = Verdict(False, why)
        return
    d.out.verdicts[job.id] = Verdict(True, "held" if cmd.held else "released")
    note = f"held (gpusv release {job.id})" if cmd.held else None
    if not cmd.held and d.pending(job.id):  # back to waiting for its parents
        note = waiting_text(d.pending(job.id) or frozenset())
    changed = evolve(job, held=cmd.held, waiting_for=note, hold_reason=None)
    kind = "held" if cmd.held else "released"
    d.put(changed, Event(kind, f"{kind} by uid {cmd.by_uid}"))


def _edit(d: Draft, cmd: HoldJob | UpdateJob) -> None:
    """The verbs that change a queued job where it waits: hold, release, update."""
    if isinstance(cmd, HoldJob):
        _hold_job(d, cmd)
    else:
        update_job(d, cmd)


def _forget(d: Draft, cmd: Forget) -> None:
    """Finished jobs leave `list`; an active one is never forgotten."""
    ids = tuple(i for i in cmd.ids if d.job(i) is None)
    if ids:
        d.out.writes.append(MarkCleaned(ids, d.now.iso))


def step(table: Table, cmd: Command, now: Now) -> Step:
    """Decide what `cmd` does to the table: its changes, writes and actions."""
    return steps(table, (cmd,), now)


def steps(table: Table, cmds: Sequence[Command], now: Now) -> Step:
    """Decide what the commands do, one after another, each on the table as those before
    it changed it: their changes, their writes (one transaction) and their actions, in
    order."""
    d = Draft(table, now)
    for cmd in cmds:
        _one(d, cmd)
    return d.out


def _one(d: Draft, cmd: Command) -> None:
    match cmd:
        case SubmitJobs():
            _submit(d, cmd)
        case Dispatch():
            _dispatch(d, cmd)
        case Spawning():
            _spawning(d, cmd)
        case Started():
            _started(d, cmd)
        case Ended():
            _ended(d, cmd)
        case Cancel():
            _cancel(d, cmd)
        case Stop():
            _stop(d, cmd.job_id, cmd.reason, cmd.evidence, cmd.reprobe)
        case HangSeen():
            _stop(d, cmd.job_id, FailureReason.GPU_HANG, cmd.evidence, cmd.card, cmd.machine)
        case Reclassify():
            _reclassify(d, cmd)
        case Progress():
            _progress(d, cmd)
        case HoldJob() | UpdateJob():
            _edit(d, cmd)
        case Recover():
            recover(d, cmd)
        case Forget():
            _forget(d, cmd)
