"""handoff's checklist as Fabric tasks (thin: parse flags, call handoff.cli.commands).

Every task takes `--host` (inventory name, ssh_config alias or [user@]address[:port],
comma-separated; Fabric's `-H/--hosts` means the same, see handoff.cli.program and fabric.yaml) and
`--role`. Without `--host`: the hosts of the last successful deploy, else the inventory's
hosts. Heavy modules are imported inside the tasks so `fab -l` is quick. Numeric flags are
taken as strings and checked by the commands (handoff.config.flags): invoke would raise a
traceback on `--lines ten`.

This file's folder is the project directory: `inventory/hosts.yml`, `roles/` and the
state dir `.handoff/` are looked up here (docs/configuration.md).
"""

from __future__ import annotations

from pathlib import Path

from invoke import Context, Exit, task

from handoff import defaults
from handoff.config import paths

paths.use_project(Path(__file__).resolve().parent)

HOST = "inventory name, ssh_config alias or [user@]address[:port]; comma-separated for several (default: the last deploy's hosts, else the inventory's)"
ROLE = "role to act as (a file in roles/); default: each host's first inventory role"
DRY = "print the plan (what would run on which host) and change nothing; connects to no host"
JOB = "one job by name (default: every job on each host)"


def _host(c: Context, host: str | None) -> str | None:
    """The task's `--host`. A Fabric Connection as the context means Fabric's own Executor ran
    the task once per -H host (fabric.yaml was not read): refuse rather than act on hosts
    nobody named."""
    if type(c).__name__ == "Connection":
        raise Exit("error: -H/--hosts needs handoff's executor (fabric.yaml next to fabfile.py); "
                   "use --host instead", code=2)
    return host


def _done(code: int) -> None:
    """End a task: `fab` exits right after it, so first move every object allocated so far
    out of the cyclic collector's reach. Interpreter shutdown otherwise walks the whole heap
    that paramiko, cryptography, rich and keyring built (about 80 ms of every command, 7% of
    a deploy). Nothing depends on collection at exit: handoff closes and fsyncs its files and
    connections explicitly, stdio is flushed by the interpreter, atexit handlers still run."""
    import gc

    gc.freeze()
    if code:
        raise Exit(code=code)


@task(auto_shortflags=False, help={"host": HOST, "role": ROLE, "dry_run": DRY,
                                   "install": "pip-install missing pure-Python modules into a venv under remote_dir first"})
def deploy(c: Context, host: str | None = None, role: str | None = None, dry_run: bool = False,
           install: bool = False) -> None:
    """verify → push-script → push-key; remembers the hosts."""
    from handoff.cli import commands

    host = _host(c, host)

    _done(commands.deploy(host, role, install=install, dry_run=dry_run))


@task(auto_shortflags=False, help={"host": HOST, "role": ROLE, "dry_run": DRY,
                                   "install": "pip-install missing pure-Python modules into <remote_dir>/venv and use its python"})
def verify(c: Context, host: str | None = None, role: str | None = None, install: bool = False,
           dry_run: bool = False) -> None:
    """Check each host has what its role needs, with fixes."""
    from handoff.cli import commands

    host = _host(c, host)

    _done(commands.verify(host, role, install=install, dry_run=dry_run))


@task(auto_shortflags=False, help={"host": HOST, "role": ROLE, "dry_run": DRY})
def push_script(c: Context, host: str | None = None, role: str | None = None, dry_run: bool = False) -> None:
    """Upload the payload release and switch `current` to it."""
    from handoff.cli import commands

    host = _host(c, host)

    _done(commands.push_script(host, role, dry_run=dry_run))


@task(auto_shortflags=False, help={"host": HOST, "role": ROLE, "dry_run": DRY})
def push_key(c: Context, host: str | None = None, role: str | None = None, dry_run: bool = False) -> None:
    """Place each host's key, 0600 (minted child key or API key)."""
    from handoff.cli import commands

    host = _host(c, host)

    _done(commands.push_key(host, role, dry_run=dry_run))


@task(auto_shortflags=False, help={"host": HOST, "role": ROLE,
                                   "yes": "pin without asking (only after checking the fingerprint on "
                                          "the host); never replaces a CHANGED key",
                                   "replace": "replace a CHANGED host key (prints the old and the new "
                                              "fingerprint)",
                                   "known_hosts": "pin into your known_hosts (ssh's first UserKnownHostsFile, "
                                                  "default ~/.ssh/known_hosts), where plain ssh finds it too "
                                                  "(default: handoff's state dir)"})
def trust_host(c: Context, host: str | None = None, role: str | None = None, yes: bool = False,
               replace: bool = False, known_hosts: bool = False) -> None:
    """Show a host's SSH key fingerprint; pin it once confirmed."""
    from handoff.cli import commands

    host = _host(c, host)

    _done(commands.trust_host(host, role, yes=yes, replace=replace, known_hosts=known_hosts))


@task(auto_shortflags=False, help={"service": f"keyring service (default {defaults.SECRET_SERVICE})",
                                   "username": f"keyring username (default {defaults.API_KEY_USERNAME}; "
                                               f"{defaults.MANAGEMENT_KEY_USERNAME} for an OpenRouter "
                                               f"management key: hosts then get minted child keys)"})
def set_key(c: Context, service: str = defaults.SECRET_SERVICE,
            username: str = defaults.API_KEY_USERNAME) -> None:
    """Store the API key (or a management key) in the OS keyring."""
    from handoff.cli import commands

    _done(commands.set_key(service, username))


@task(auto_shortflags=False, help={"host": HOST, "role": ROLE,
                                   "model": "model slug to test (default: the model var)"})
def smoke_test(c: Context, host: str | None = None, role: str | None = None, model: str | None = None) -> None:
    """One real request per host: provider, latency, cost, credit."""
    from handoff.cli import commands

    host = _host(c, host)

    _done(commands.smoke_test(host, role, model=model))


@task(auto_shortflags=False, iterable=["input"], help={
    "host": HOST, "role": ROLE,
    "input": "local prompts file (JSONL), pushed to <remote_dir>/data/ (skipped if unchanged); "
             "repeat it, or quote a glob ('data/B*.jsonl'): one job per file, named after its stem",
    "remote_input": "prompts file already on the hosts (instead of --input)",
    "job": "job name when there is one input (default: the input file's stem, or the role's job var)",
    "model": "model slug (overrides the model var)",
    "base_url": "API base URL (overrides the base_url var)",
    "concurrency": "in-flight requests per host and job (overrides the concurrency var)",
    "max_cost": "USD budget of each job, split over its hosts: host i of n gets max_cost/n "
                "(overrides the max_cost var)",
    "max_tokens": "max tokens per response",
    "temperature": "sampling temperature, 0-2 (overrides the temperature var; K2.5 thinking: 1)",
    "top_p": "nucleus sampling, 0-1 (overrides the top_p var; K2.5 thinking: 0.95)",
    "seed": "sampling seed, a whole number >= 0 (providers may ignore it)",
    "reasoning": "OpenRouter's reasoning object as JSON: '{\"effort\": \"high\"}', "
                 "'{\"max_tokens\": 8000}', '{\"exclude\": true}' (overrides the reasoning var)",
    "provider": "OpenRouter's provider routing object as JSON, e.g. "
                "'{\"require_parameters\": true}'; null sends none (overrides the provider var)",
    "turns": "last (regenerate the final assistant turn) or all (every assistant turn, in order)",
    "max_timeouts": "times a prompt whose request timed out is asked again (default 1)",
    "stream": "auto (the default: stream the answers), on, or off (one JSON body per answer); "
              "overrides the stream var",
    "idle_timeout": "seconds a streamed answer may be silent once it began (default 120)",
    "first_token_timeout": "seconds a stream may take to begin its answer; the provider's "
                           "queue comments do not extend it (default 600)",
    "request_timeout": "seconds one request may take in all (default 3600)",
    "drain_timeout": "on fab stop, seconds the requests in flight may take to finish before "
                     "they are closed, which stops their bill (default 30; 0: at once); a "
                     "relaunch asks the closed ones again",
    "mode": "sync (one request per prompt, the default), batch (the provider's Batch API: about "
            "half the price, answers within 24 h; fab stop cancels its batches) or auto (batch "
            "when the server has a Batch API, else sync); overrides the mode var",
    "no_shard": "run the whole input on every host instead of sharding it i/n",
    "take_over": "HOST: move that host's shard of --job to the one --host (a host that died): "
                 "only the ids its last fetched copy lacks are asked there",
    "dest": "with --take-over: the folder fetch wrote, where the host's last copy is "
            "(default: results/ in the project folder)",
    "dry_run": DRY + "; shows the estimate too",
})
def launch(c: Context, host: str | None = None, role: str | None = None, input: list[str] | None = None,
           remote_input: str | None = None, job: str | None = None, model: str | None = None,
           base_url: str | None = None, concurrency: str | None = None, max_cost: str | None = None,
           max_tokens: str | None = None, temperature: str | None = None, top_p: str | None = None,
           seed: str | None = None, reasoning: str | None = None, provider: str | None = None,
           turns: str | None = None, max_timeouts: str | None = None, mode: str | None = None,
           stream: str | None = None, idle_timeout: str | None = None,
           first_token_timeout: str | None = None, request_timeout: str | None = None,
           drain_timeout: str | None = None,
           no_shard: bool = False, take_over: str | None = None, dest: str | None = None,
           dry_run: bool = False) -> None:
    """Start one job per dataset on each host, sharded i/n."""
    from handoff.cli import commands

    host = _host(c, host)

    flags = {"model": model, "base_url": base_url, "concurrency": concurrency,
             "max_cost": max_cost, "max_tokens": max_tokens, "job": job,
             "temperature": temperature, "top_p": top_p, "seed": seed, "reasoning": reasoning,
             "provider": provider, "turns": turns, "max_timeouts": max_timeouts, "mode": mode,
             "stream": stream, "idle_timeout": idle_timeout,
             "first_token_timeout": first_token_timeout, "request_timeout": request_timeout,
             "drain_timeout": drain_timeout}
    _done(commands.launch(host, role, local_input=input, remote_input=remote_input, flags=flags,
                          shard=not no_shard, dry_run=dry_run, take_over=take_over, dest=dest))


@task(auto_shortflags=False, help={
    "host": HOST, "role": ROLE, "job": JOB,
    "json": "print one JSON object per host and job instead of the table",
    "wait": "keep watching until no job is running",
    "interval": "seconds between refreshes with --wait (default 2)",
})
def status(c: Context, host: str | None = None, role: str | None = None, job: str | None = None,
           json: bool = False, wait: bool = False, interval: str | None = None) -> None:
    """Every job on every host: state, progress, cost, ETA, keys."""
    from handoff.cli import commands

    host = _host(c, host)

    _done(commands.status(host, role, job=job, as_json=json, wait=wait, interval=interval))


@task(auto_shortflags=False, help={
    "host": HOST, "role": ROLE, "job": JOB,
    "follow": "keep streaming new lines until Ctrl-C", "lines": "how many last lines (default 40)",
})
def logs(c: Context, host: str | None = None, role: str | None = None, job: str | None = None,
         follow: bool = False, lines: str | None = None) -> None:
    """Print the jobs' logs; --follow streams until Ctrl-C."""
    from handoff.cli import commands

    host = _host(c, host)

    _done(commands.logs(host, role, job=job, follow=follow, lines=lines))


@task(auto_shortflags=False, help={
    "host": HOST, "role": ROLE, "job": JOB,
    "timeout": "seconds to wait for the graceful drain (default 60; 0 = do not wait)",
    "now": "no drain: the requests in flight are closed at once, which stops their bill "
           "(a second SIGTERM); a relaunch asks them again",
    "dry_run": DRY,
})
def stop(c: Context, host: str | None = None, role: str | None = None, job: str | None = None,
         timeout: str | None = None, now: bool = False, dry_run: bool = False) -> None:
    """SIGTERM the jobs: drained, then closed; resumable."""
    from handoff.cli import commands

    host = _host(c, host)

    _done(commands.stop(host, role, job=job, timeout=timeout, now=now, dry_run=dry_run))


@task(auto_shortflags=False, help={"host": HOST, "role": ROLE})
def jobs(c: Context, host: str | None = None, role: str | None = None) -> None:
    """List the jobs on the hosts: input, shards → hosts, state."""
    from handoff.cli import commands

    host = _host(c, host)

    _done(commands.jobs(host, role))


@task(auto_shortflags=False, help={
    "host": HOST, "role": ROLE, "job": "the job to forget (required)",
    "yes": "remove without asking (its folder and outputs on every host: fetch first)",
    "dry_run": DRY,
})
def forget(c: Context, host: str | None = None, role: str | None = None, job: str | None = None,
           yes: bool = False, dry_run: bool = False) -> None:
    """Remove a stopped or finished job from its hosts."""
    from handoff.cli import commands

    host = _host(c, host)

    _done(commands.forget(host, role, job=job, yes=yes, dry_run=dry_run))


@task(auto_shortflags=False, help={
    "host": HOST, "role": ROLE, "job": JOB,
    "dest": "local folder: DEST/<host>/<job>/ per host, DEST/<job>/output.jsonl merged "
            "(default: results/ in the project folder, from any folder below it)",
})
def fetch(c: Context, host: str | None = None, role: str | None = None, job: str | None = None,
          dest: str | None = None) -> None:
    """Pull every job's outputs back; merge each job's shards."""
    from handoff.cli import commands

    host = _host(c, host)

    _done(commands.fetch(host, role, job=job, dest=dest))


@task(auto_shortflags=False, help={
    "host": HOST + "; only with --watch (the report itself reads the fetched files)",
    "role": ROLE + "; only with --watch",
    "job": "one job's page only (default: every job fetched, and the run's page)",
    "dest": "the folder fetch wrote (default results): DEST/report.html, DEST/<job>/report.html",
    "watch": "serve the pages live on 127.0.0.1, read from the hosts, until Ctrl-C",
    "open": "open the report (or the live page) in your browser",
    "interval": "seconds between the live page's refreshes with --watch (default 5)",
    "answers": "random answers in the answers browser, and at most as many cut ones and "
               "failures (default 200)",
    "port": "the port on 127.0.0.1 for --watch (default 0: any free one; the URL is printed)",
})
def report(c: Context, host: str | None = None, role: str | None = None, job: str | None = None,
           dest: str = "results", watch: bool = False, open: bool = False,
           interval: str | None = None, answers: str | None = None, port: str | None = None) -> None:
    """The run's HTML report with plots; --watch serves it live."""
    from handoff.cli import commands

    host = _host(c, host)

    _done(commands.report(host, role, job=job, dest=dest, watch=watch, open_page=open,
                          interval=interval, answers=answers, port=port))


@task(auto_shortflags=False, help={"host": "only these hosts (default: every host the ledger lists, "
                                           "every inventory host and the last deploy's hosts)",
                                   "role": "only the inventory's hosts of this role",
                                   "force": "also on a host where a job still runs (its key is "
                                            "revoked: the job stops with 401, resumable); without "
                                            "it such a host is left as it is, exit 1",
                                   "dry_run": DRY})
def cleanup_secrets(c: Context, host: str | None = None, role: str | None = None,
                    force: bool = False, dry_run: bool = False) -> None:
    """Remove placed keys, revoke child keys, verify all gone."""
    from handoff.cli import commands

    host = _host(c, host)

    _done(commands.cleanup_secrets(host, dry_run=dry_run, role=role, force=force))


@task(auto_shortflags=False, help={
    "hosts": "sandbox containers to start (default 2)",
    "results": "where to copy the results (default demo-results)",
    "keep": "keep the sandbox's temp dir instead of deleting it",
})
def demo(c: Context, hosts: str = "2", results: str = "demo-results", keep: bool = False) -> None:
    """The whole checklist against a throwaway local sandbox."""
    from handoff.cli import demo as demo_mod
    from handoff.config import flags
    from handoff.errors import UsageError

    try:
        count = flags.whole("--hosts", hosts, minimum=1, maximum=253, default=2)
    except UsageError as exc:
        raise Exit(f"error: {exc}", code=2) from None
    _done(demo_mod.run(hosts=count or 2, results=results, keep=keep))
