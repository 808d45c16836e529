"""The store: the SQLite database and everything that reads or writes it.

It owns the schema and its migrations, the checks made before a database is trusted, the
group-commit writer, the one transaction per engine turn (`commit.py`), and the queries the
other rooms read with. Only the engine's commit writes the jobs and attempts tables; every
other room reads through `database.Store` and writes by sending the engine a command. This
room imports none of the other rooms (`requests/`, `running/`, `watch/`, `life/`).
"""
