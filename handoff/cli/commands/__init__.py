"""The `fab` tasks as plain functions returning an exit code: the command layer.

Each command does only what every command does: pick its targets, build its plan (or call
its read-only operation), run it on the hosts, print the summary and return the exit code.
What happens ON a host lives with the thing it acts on:

| concern | module |
|---|---|
| verify (probe, checks, `--install`) | handoff.ops.verify, handoff.host.facts |
| the release (build, upload, switch, prune) | handoff.ops.releases, handoff.host.transfer |
| the key (keyring, placement, cleanup) | handoff.ops.secrets |
| deploy = verify + release + key | handoff.ops.deploy |
| jobs: launch, status, logs, stop, smoke-test | handoff.ops.jobs.* |
| fetch | handoff.ops.fetch |
| report (the run's HTML report, its live page) | handoff.ops.report |
| host keys (trust-host) | handoff.ops.trust, handoff.ssh.hostkeys |

fabfile.py parses flags and calls these; `fab demo` and tests call them directly. Every
command catches HandoffError at the top and prints its message (which names the fix),
so no traceback is ever the user interface. Exit codes: 0 done everywhere, 1 a host
failed (or a job is not running / finished, for `status`), 2 bad usage (flags, inventory,
roles, hosts), 130 interrupted.

The modules, by command group (the names below are this package's surface):

- `common`: how a command reaches a host (`common.CONNECT`, which tests point at a local
  session), `guarded` (failures to messages and exit codes), targets, running a plan;
- `prepare`: deploy, verify, push-script, push-key, set-key, trust-host;
- `work`: smoke-test, launch, status, jobs, forget, logs, stop;
- `finish`: fetch, cleanup-secrets;
- `report`: report (the pages from the fetched files, `--watch` live from the hosts).
"""

from handoff.cli.commands.common import (
    Interrupted,
    ask,
    exit_code,
    guarded,
    only_reading,
    run_plan,
    targets_for,
)
from handoff.cli.commands.finish import cleanup_secrets, fetch
from handoff.cli.commands.prepare import deploy, push_key, push_script, set_key, trust_host, verify
from handoff.cli.commands.report import report
from handoff.cli.commands.work import forget, jobs, launch, logs, smoke_test, status, stop

__all__ = ["Interrupted", "ask", "cleanup_secrets", "deploy", "exit_code", "fetch", "forget",
           "guarded", "jobs", "launch", "logs", "only_reading", "push_key", "push_script",
           "report", "run_plan", "set_key", "smoke_test", "status", "stop", "targets_for",
           "trust_host", "verify"]
