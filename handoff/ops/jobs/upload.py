"""A launch's jobs and their inputs: one job per local dataset (or the one remote input),
and pushing a local dataset to each host (`push-input`).

The push goes to `<remote_dir>/data/<name>` through a part file (`.<name>.tmp-part`); it is
skipped when the host holds the same bytes (sha256 compared on the host), and a cut upload
resumes from its part when the part's prefix matches: a 2 MiB probe (its first and last
MiB) before anything moves, then the whole prefix's sha256 (computed on the host, never read
back) beside the upload, before the rename; a mismatch starts the upload over, saying so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from handoff.errors import RemoteError, UsageError
from handoff.host import remote_code
from handoff.host.session import Session, sh_path
from handoff.host.targets import Target
from handoff.host.transfer import mkdirs, upload_resumable
from handoff.ops.jobs import budget, datasets, moves
from handoff.ops.jobs.datasets import Dataset
from handoff.ops.jobs.state import job_name
from handoff.run.plan import HostContext, Plan, Skipped, Step
from payload import units


def input_file(job: str) -> str:
    """The name the probe reports a job's input under."""
    return f"input:{job}"


@dataclass(frozen=True)
class LaunchJob:
    """One job of the launch, the same on every host (its shards)."""

    job: str
    input_path: str  # where the hosts read it, as configured (`~` unresolved)
    dataset: Dataset | None  # the local file pushed there; None: --remote-input / input var


@dataclass
class LaunchPrivate(budget.ManagementCarrier, moves.ExclusionsCarrier):
    """A launch's private values: the jobs it starts (each with its dataset, when local),
    from the command, where the key steps get a management client, and a take-over's ids in
    hand (handoff.ops.jobs.moves)."""

    jobs: list[LaunchJob] = field(default_factory=list)


def private_of(p: Plan) -> LaunchPrivate:
    """A launch plan's private values (the command sets its management keys)."""
    if not isinstance(p.private, LaunchPrivate):
        raise RuntimeError(f"plan {p.title!r} is not a launch plan")
    return p.private


@dataclass(frozen=True)
class PushInput:
    job: str
    input: str  # where on the host


def jobs_of(targets: list[Target], local: list[Dataset] | None, remote_input: str | None,
            job_flag: str | None) -> list[LaunchJob]:
    """The launch's jobs: one per local dataset, else the one remote input (or `input` var)."""
    if local:
        return [LaunchJob(ds.job, targets[0].layout.data_file(ds.name), ds) for ds in local]
    first = targets[0]
    path = remote_input or (str(first.vars["input"]) if first.vars.get("input") else None)
    if not path:
        raise UsageError("no input: pass --input LOCAL.jsonl (repeatable, or a quoted glob) or "
                         "--remote-input PATH (or set the `input` var)")
    return [LaunchJob(job_name(first, job_flag, path), path, None)]


def load_datasets(targets: list[Target], local_inputs: list[str], job_flag: str | None,
                  shards: int = 1) -> list[Dataset]:
    """The local inputs, expanded, named and checked (handoff.ops.jobs.datasets; each
    shard's prompts counted when `shards` > 1)."""
    paths = datasets.expand(local_inputs)
    if job_flag and len(paths) > 1:
        raise UsageError(f"--job names one job, but the inputs are {len(paths)} files (one job "
                         f"each, named after the file's stem); drop --job, or launch one input "
                         f"at a time")
    names = [job_name(targets[0], job_flag, p.name) for p in paths]
    return datasets.load(paths, names, shards)


def push_step(j: LaunchJob, data_dir: str) -> Step:
    """The `push-input` step of a job whose input is a local dataset (`j.dataset`)."""
    ds = j.dataset
    assert ds is not None  # push steps exist only for local datasets
    return Step(
        "push-input", f"push {ds.name} ({units.size(ds.size)}, {ds.check.prompts} "
                      f"prompts, sha256 {ds.sha256[:12]}) to {j.input_path}",
        f"sftp put {data_dir}/.{ds.name}.tmp-part (a cut upload's part resumed "
        f"when its prefix matches: a 2 MiB probe, then its whole sha256 beside the "
        f"upload) then rename to {j.input_path}",
        "unless the host holds the same file (sha256 compared on the host)",
        PushInput(j.job, j.input_path), run=_push_input)


def _push_input(ctx: HostContext, step: Step) -> str:
    s = ctx.session
    jobs = ctx.private_as(LaunchPrivate).jobs
    j = next(j for j in jobs if j.job == step.args(PushInput).job)
    assert j.dataset is not None  # push-input steps exist only for local datasets
    ds = j.dataset
    if ctx.need_facts().file(input_file(j.job)).sha256 == ds.sha256:
        return Skipped(f"input {ds.name} unchanged on the host")
    dest = s.abs(j.input_path)
    try:
        mkdirs(s.files, dest.rsplit("/", 1)[0], known=ctx.need_facts().dirs)
        notes: list[str] = []
        resumed = upload_resumable(s.files, ds.path, dest, label=s.label,
                                   remote_sha256=lambda path, n: _prefix_sha256(s, path, n),
                                   remote_probe=lambda path, n: _probe_sha256(s, path, n),
                                   notes=notes)
    except OSError as exc:
        raise RemoteError(f"{s.label}: pushing {ds.name} to {dest} failed: {exc}; run the "
                          f"launch again to resume the upload") from None
    more = f" (resumed after {units.size(resumed)})" if resumed else ""
    said = "".join(f"; not resumed: {note}" for note in notes)
    return f"pushed {ds.name} → {dest}{more}{said}"


def _prefix_sha256(s: Session, path: str, n: int) -> str | None:
    """The sha256 of the first `n` bytes of `path` on the host (computed there: a resumed
    upload checks its part file without reading it back)."""
    res = s.exec(f"head -c {int(n)} {sh_path(path)} | sha256sum")
    return res.out.split()[0] if res.rc == 0 and res.out.split() else None


def _probe_sha256(s: Session, path: str, n: int) -> str | None:
    """The probe sha256 of the first `n` bytes of `path` on the host (their first and last
    MiB: remote_code.fetch_list's `hash` mode), the cheap check before a resumed upload."""
    answer = s.run_code(remote_code.FETCH_LIST, {"hash": {path: int(n)}, "probe": True},
                        "checking the uploaded part")
    digests = answer.get("sha256") if isinstance(answer, dict) else None
    digest = digests.get(path) if isinstance(digests, dict) else None
    return digest if isinstance(digest, str) else None
