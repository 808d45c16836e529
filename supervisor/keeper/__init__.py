"""The keeper: a small long-lived process that owns running jobs and outlives gpusvd.

gpusvd starts one keeper per pool (a card, or the CPU slots) in a session of its own.
The keeper forks and execs jobs, watches them through pidfds, records every start and
exit durably in its journal under the state dir, and serves gpusvd over a Unix socket.
It imports only the standard library and never touches a GPU or the database, so it
stays small (docs/keepers.md).
"""
