"""Requests: the Unix-socket server and what each request does.

`server.py` frames lines, checks peer credentials and limits connections; one handler module
per group of verbs answers them (`handlers.py`: submit, list, show, logs, cancel, wait;
`everyday.py`: restart, hold, release, pause, resume, clean; `telemetry.py`: gpus, stats,
health, metrics, top); `intake.py` checks and queues new jobs (submit, restart, an array's
failed indices) and finds a job by id; `access.py` says who may act on what, `waiting.py`
holds requests that wait for a job's end. `handlers.py` builds the other handler objects
and routes to them; only the daemon's assembly imports it.

Handlers read through the store and change job state only by sending the engine a command;
they never reach into `running/`'s internals.
"""
