"""A job as read from its host: name, folder, process, status file, and the state derived
from them (running, stopping, finished, stopped, aborted, dead, none); every job of a host
in one round trip (`read_all`); how a job is named.

A job's name: `--job NAME`, else the `job` var (a role may name its one job, e.g. the
extractor's `extractor`), else the stem of its input file (`data/B3.jsonl` -> `B3`: one job
per dataset), else the role's name."""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from handoff.config import state
from handoff.config.layout import RemoteLayout, job_keys_folder, key_record
from handoff.config.roles import Role
from handoff.config.templates import Text
from handoff.console import has_control, visible
from handoff.errors import NotDeployed, RemoteError, UsageError, did_you_mean
from handoff.host import keyrecord, remote_code, untrusted
from handoff.host.facts import KEY_FILE, Facts
from handoff.host.remote_code import jobs as job_code
from handoff.host.session import Session
from handoff.host.targets import Target

# `fab status` exits 0 only when every job is in one of these.
OK_STATES = frozenset({"running", "starting", "finished"})
# States in which the job's process still runs (`status --wait` keeps watching).
ACTIVE_STATES = frozenset({"running", "starting", "stopping"})


def job_name(target: Target, flag: str | None, input_path: str | None = None) -> str:
    """`--job`, else the `job` var, else the input file's stem, else the role's name; a
    plain folder name."""
    stem = PurePosixPath(input_path).name.rsplit(".", 1)[0] if input_path else None
    name = flag or target.vars.get("job") or stem or (target.role.name if target.role else None)
    if not name:
        raise UsageError(f"{target.label}: no job name; pass --job NAME or --role ROLE")
    check_job_name(str(name))
    return str(name)


def check_job_name(name: str) -> None:
    """A job is a folder under jobs/: one plain name, nothing that climbs out or hides."""
    if not name or "/" in name or name.startswith(".") or has_control(name):
        raise UsageError(f"job name {visible(repr(name))} must be a plain folder name (no '/', "
                         f"no leading '.', no control or invisible format character); pass "
                         f"--job NAME, or rename the input file")


@dataclass(frozen=True)
class JobState:
    """handoff.host.remote_code.jobs' answer, typed."""

    job_dir: str
    status: dict[str, Any] | None = None  # status.json as the payload wrote it
    meta: dict[str, Any] | None = None  # job.json as launch wrote it
    pid: int | None = None
    alive: bool = False
    keys: dict[str, bool] = field(default_factory=dict)  # key file -> still present
    records: dict[str, Any] = field(default_factory=dict)  # minted key record path -> JSON
    problems: list[str] = field(default_factory=list)  # what the host answered wrong
    # The answers' latency_s as a histogram (bin -> answers: remote_code.jobs.latency), when
    # asked (`fab status`) and the job has an output.
    latency: dict[int, int] | None = None
    # The job's own key (a job with a budget: handoff.ops.jobs.keys): there or not, and the
    # record beside it (None: the job has none).
    own_key: bool = False
    own_record: dict[str, Any] | None = None
    # The generator's batch ledger as counted on the host (batches, live, live_requests), or
    # None: no batch mode. `fab stop` cancels the live batches of a job whose process is gone.
    ledger: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, raw: Any) -> JobState:
        """The host's answer, read field by field (handoff.untrusted): a field of the wrong
        type is left out and named in `problems`, never a crash of every host's status."""
        if not isinstance(raw, dict):
            return cls("", problems=[f"the job state is not a JSON object ({type(raw).__name__})"])
        status, status_problems = untrusted.status(raw.get("status"))
        meta, meta_problems = untrusted.meta(raw.get("meta"))
        keys, records = raw.get("keys"), raw.get("records")
        latency, latency_problems = _latency(raw.get("latency"))
        found = raw.get("own_key")
        own: dict[str, Any] = found if isinstance(found, dict) else {}
        ledger = untrusted.batch_counts(raw.get("ledger"))
        if raw.get("ledger") is not None and ledger is None:
            meta_problems = [*meta_problems, "batches.json: its counts are not valid"]
        return cls(untrusted.text(raw.get("job_dir")) or "", status, meta,
                   untrusted.count(raw.get("pid")) or None, raw.get("alive") is True,
                   {str(k): v is True for k, v in keys.items()} if isinstance(keys, dict) else {},
                   {str(k): v for k, v in records.items() if isinstance(v, dict)}
                   if isinstance(records, dict) else {},
                   status_problems + meta_problems + latency_problems, latency,
                   own.get("exists") is True,
                   own.get("record") if isinstance(own.get("record"), dict) else None, ledger)

    @property
    def name(self) -> str:
        """The job's name: its folder's."""
        return PurePosixPath(self.job_dir).name if self.job_dir else ""

    @property
    def input_sha256(self) -> str | None:
        """The sha256 of the input this job was launched with (job.json), if recorded."""
        value = (self.meta or {}).get("input_sha256")
        return str(value) if value else None

    @property
    def exit_code(self) -> int | None:
        """The payload's exit code, from its final status (None while it runs)."""
        code = (self.status or {}).get("exit_code")
        return code if isinstance(code, int) and not isinstance(code, bool) else None

    @property
    def with_failures(self) -> bool:
        """Finished, but with more permanent failures than --max-failed (payload exit 1)."""
        return self.state == "finished" and self.exit_code == 1

    @property
    def state(self) -> str:
        file_state = (self.status or {}).get("state")
        if self.alive:
            # Alive after writing stopped/aborted: draining in-flight requests after SIGTERM/402.
            return "stopping" if file_state in ("stopped", "aborted") else "running"
        if file_state == "running":
            return "dead"  # the status says running but no process: killed or crashed
        if file_state:
            return str(file_state)
        return "dead" if self.pid else "none"

    @property
    def live_batches(self) -> int:
        """Batches of this job its ledger does not show collected: they may still run (and
        cost) at the provider."""
        return int((self.ledger or {}).get("live") or 0)

    @property
    def keys_placed(self) -> list[str]:
        return [path for path, present in self.keys.items() if present]

    @property
    def own_key_record(self) -> keyrecord.KeyRecord | None:
        """The record of the job's own child key, if it has one."""
        return keyrecord.KeyRecord.from_json(self.own_record) if self.own_record else None

    @property
    def key_record(self) -> keyrecord.KeyRecord | None:
        """The record of the minted child key the host's key file holds, if it is one."""
        for raw in self.records.values():
            record = keyrecord.KeyRecord.from_json(raw)
            if record is not None:
                return record
        return None


# The histogram's bins a host may name: its range (remote_code.jobs.LATENCY_RANGE) in bins.
LATENCY_BINS = range(job_code.latency_bin(job_code.LATENCY_RANGE[0]),
                     job_code.latency_bin(job_code.LATENCY_RANGE[1]) + 1)


def _latency(raw: Any) -> tuple[dict[int, int] | None, list[str]]:
    """The host's latency histogram, checked: bins in range, counts whole numbers >= 0; else
    none, and the problem named (the host's word, like the status file)."""
    if raw is None:
        return None, []
    bins = raw.get("bins") if isinstance(raw, dict) else None
    bad = (None, ["the latency histogram is not valid"])
    if not isinstance(bins, dict) or len(bins) > len(LATENCY_BINS):
        return bad
    out: dict[int, int] = {}
    for key, value in bins.items():
        n = untrusted.count(value)
        i = int(key) if isinstance(key, str) and len(key) < 8 and key.lstrip("-").isdigit() else None
        if n is None or i is None or i not in LATENCY_BINS:
            return bad
        out[i] = n
    return out, []


def latency_quantiles(bins: dict[int, int] | None,
                      shares: tuple[float, ...] = (0.5, 0.95)) -> list[float] | None:
    """The latencies (s) under which those shares of the answers fall, from a histogram (to
    its bins' 1%); None without answers."""
    total = sum((bins or {}).values())
    if not bins or not total:
        return None
    ordered = sorted(bins.items())
    out = []
    for share in shares:
        seen = 0
        for i, n in ordered:
            seen += n
            if seen >= share * total:
                out.append(job_code.LATENCY_RATIO ** i)
                break
    return out


def placed_keys(target: Target) -> list[str]:
    """The key files to look for on this host: its own key_path (what the host holds, even
    if the ledger was lost) and any other the ledger says was placed there."""
    ep = target.endpoint
    own = [str(target.vars["key_path"])] if target.vars.get("key_path") else []
    return list(dict.fromkeys([*own, *(e.path for e in state.placed()
                                       if (e.hostname, e.port, e.user) == (ep.hostname, ep.port, ep.user))]))


def _key_args(target: Target) -> dict[str, Any]:
    key_path = str(target.vars["key_path"]) if target.vars.get("key_path") else None
    return {"keys": placed_keys(target), "records": [key_record(key_path)] if key_path else [],
            **({"job_keys": job_keys_folder(key_path)} if key_path else {})}


def read(session: Session, job: str, *, latency: bool = False) -> JobState:
    """The job's state on the host (one round trip), with the key files' presence read on
    the host itself and the record of a minted key (`latency`: and its answers' latency)."""
    target = session.target
    args = {"op": "state", "job_dir": target.layout.job(job), **_key_args(target),
            **({"latency": True} if latency else {})}
    return JobState.from_json(session.run_code(remote_code.JOBS, args, "reading the job state"))


@dataclass(frozen=True)
class HostJobs:
    """Every job on one host, and the host's key files, from one round trip."""

    jobs: dict[str, JobState]  # name -> state, sorted by name
    keys: JobState  # no job: only the key files' presence and the minted key's record

    def get(self, name: str) -> JobState:
        """The named job, or an empty state (`none`: never launched) with the host's keys."""
        return self.jobs.get(name) or JobState(f"{self.keys.job_dir}/{name}", keys=self.keys.keys,
                                               records=self.keys.records)


def read_all(session: Session, *, latency: bool = False) -> HostJobs:
    """Every job under the host's jobs/ folder (one round trip), each with the host's keys
    (`latency`: and its answers' latency)."""
    target = session.target
    raw = session.run_code(remote_code.JOBS, {"op": "list", "jobs_dir": target.layout.jobs,
                                              **_key_args(target),
                                              **({"latency": True} if latency else {})},
                           "listing the jobs")
    if not isinstance(raw, dict):
        raise untrusted.Untrusted(f"{session.label}: listing the jobs: the answer is not a JSON "
                                  f"object")
    common = {"keys": raw.get("keys") or {}, "records": raw.get("records") or {}}
    listed = raw.get("jobs")
    listed = listed if isinstance(listed, dict) else {}
    jobs = {}
    for name, job in sorted(listed.items()):
        current = JobState.from_json({**(job if isinstance(job, dict) else {}), **common})
        problem = untrusted.name_problem(name)
        if problem:  # a folder no launch could have made: shown (visibly), never acted on
            current = dataclasses.replace(current, problems=[
                f"job folder name {problem}: handoff never made it", *current.problems])
        jobs[str(name)] = current
    jobs_dir = untrusted.text(raw.get("jobs_dir")) or ""
    return HostJobs(jobs, JobState.from_json({"job_dir": jobs_dir, **common}))


def unknown_job(session: Session, job: str) -> RemoteError:
    """The error for a `--job` the host has never run: it names the jobs the host has (one
    more round trip, only on this error path), so a typo is not answered "not running"."""
    names = list(read_all(session).jobs)
    return RemoteError(f"{session.label}: no job {job!r} on the host; jobs there: "
                       f"{', '.join(names) or 'none'}{did_you_mean(job, names)}")


def require_deployed(session: Session, facts: Facts, role: Role | None) -> None:
    """The host has a release and, when the role takes it, the key."""
    if not facts.current:
        raise NotDeployed(f"{session.label}: no release on the host; run "
                          f"`fab deploy {session.target.flags()}` first")
    if role is not None and role.secret and not facts.file(KEY_FILE).exists:
        raise NotDeployed(f"{session.label}: no API key at {session.vars['key_path']}; run "
                          f"`fab push-key {session.target.flags()}` (or deploy) first")


def job_vars(session: Session, facts: Facts, job: str, extra: dict[str, Any],
             key_path: str | None = None) -> dict[str, Any]:
    """The vars a role's launch/smoke command renders with on this host: absolute paths, the
    venv's python when `verify --install` made one, and the command's own values;
    `key_path`: the job's own key (a budget: handoff.ops.jobs.keys), else the host's."""
    return command_vars(session.target, session.layout.root, effective_python(session, facts),
                        key_path or session.abs(str(session.vars["key_path"])), job, extra)


def command_vars(target: Target, remote_dir: str, python: str, key_path: str, job: str,
                 extra: dict[str, Any]) -> dict[str, Any]:
    """The vars a role's command renders with. The paths (made from the home the host
    reported) and the command's own values are `Text`: filled in as they are, never
    rendered again as templates, whatever `{…}` a host put in its home (`python` is the
    inventory's var, or the venv's path as `effective_python` made it Text)."""
    v = dict(target.vars)
    v.update(python=python, remote_dir=Text(remote_dir), key_path=Text(key_path),
             job_dir=Text(RemoteLayout(remote_dir).job(job)))
    v.update({k: Text(val) if isinstance(val, str) else val for k, val in extra.items()
              if val is not None})
    return v


def effective_python(session: Session, facts: Facts) -> str:
    """The venv's python when the probe ran under it, else the `python` var as written."""
    venv = session.layout.venv_python
    # The venv's path comes from the host: text, never a template (config.templates.Text).
    return Text(shlex.quote(facts.executable)) if facts.executable == venv else str(session.vars["python"])
