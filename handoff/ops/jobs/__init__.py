"""Jobs: what `fab launch` starts on a host and `status`, `logs`, `stop` act on.

A job lives in `<remote_dir>/jobs/<job>/`: `output.jsonl`, `output.errors.jsonl`,
`status.json`, `log`, `pid` and `job.json` (what was launched, with the input's sha256).
One job per dataset: a launched input file names its job after its stem (`B3.jsonl` ->
`B3`), unless `--job` or a role's `job` var (the extractor's `extractor`) names it. It is
started detached (setsid, nohup, stdin from /dev/null, no pty) so it survives the SSH
session; the key reaches it only as `--api-key-file PATH`, never in argv as a value, never
in `env=`. Everything that runs on the host for a job is handoff.host.remote_code.jobs (one
round trip per start, stop, check or state read; `list` reads every job of a host at once).

- `state`: a job's name, folder and state as read from the host (`JobState`, `read_all`).
- `datasets`: the `--input` files, checked locally by the payload's rules, one job each.
- `estimate`: prompts, tokens, cost and time per dataset, before a launch.
- `budget`: a job's budget split over its hosts (`host_share`), the child keys' limits.
- `launch`: the launch plan (probe, push the inputs, start, check), `--dry-run` included.
- `upload`: a launch's jobs and their inputs; pushing the local ones (resumable).
- `probe`: a launch's first step per host: what must be there, a job's identity.
- `start`: a launch's start-job and check-jobs steps; the sampling vars.
- `stop`: the stop plan (SIGTERM, wait for the drain), every running job or one.
- `status/`: the per-host-and-job table / JSON records, `--wait` (views, shards, tables, wait).
- `logs`: every job's last log lines, `--follow`.
- `forget`: remove a finished or abandoned job's folder from its hosts (never while it runs).
- `smoke`: `fab smoke-test`, one real request per host, its figures kept for the estimate.
"""
