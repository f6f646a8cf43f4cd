"""Jobs: what `fab launch` starts on a host and `status`, `logs`, `stop` act on.

A job lives in `<remote_dir>/jobs/<job>/` (default job name: the role's `job` var, e.g.
`generator`): `output.jsonl`, `output.errors.jsonl`, `status.json`, `log`, `pid` and
`job.json`. It is started detached (setsid, nohup, stdin from /dev/null, no pty) so it
survives the SSH session; the key reaches it only as `--api-key-file PATH`, never in argv
as a value, never in `env=`. Everything that runs on the host for a job is
handoff.remote_code.jobs (one round trip per start, stop or state read).

- `state`: a job's name, folder and state as read from the host (`JobState`).
- `launch`: the launch plan (probe, push the input, start), `--dry-run` included.
- `stop`: the stop plan (SIGTERM, wait for the drain).
- `status`: the per-host table / JSON records, `--wait`.
- `logs`: the log's last lines, `--follow`.
- `smoke`: `fab smoke-test`, one real request per host.
"""
