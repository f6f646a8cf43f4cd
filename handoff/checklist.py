"""The first half of the checklist as plans: verify → push-script → push-key (= deploy).

Each builder turns targets into a Plan without connecting; `HANDLERS` execute its
steps. The probe is always the first step: one round trip that both verifies the
host and tells the later steps what is already there, so an unchanged redeploy is
connect + probe and nothing else.
"""

from __future__ import annotations

from concurrent.futures import Future

from handoff import releases, secrets
from handoff.errors import HandoffError, RemoteError, SecretError
from handoff.parallel import HostReport
from handoff.plan import Handler, HostContext, HostPlan, Plan, Skipped, Step, execute
from handoff.roles import render_value
from handoff.targets import Target
from handoff.verify import evaluate, install_missing, probe, report_verdict

KEY_FILE = "key"


def _probe_step(target: Target, check: bool, install: bool, key: bool, shard: str | None,
                preflight: bool, dirs: list[str]) -> Step:
    role = target.role.name if target.role else "no role"
    req = target.role.requires if target.role else None
    wants = []
    if req:
        wants.append("python >= " + ".".join(map(str, req.python)))
        wants += req.modules_needed(target.vars) + list(req.commands)
        if req.gpus_needed(target.vars):
            wants.append(f"{req.gpus_needed(target.vars)} CUDA GPU(s)")
        if req.disk_gb:
            wants.append(f"{req.disk_gb:g} GB free")
        if req.cuda_torch:
            wants.append("CUDA through torch")
        wants += [render_value(f, target.vars) or f for f in req.files]
        if preflight and target.role is not None and target.role.preflight is not None:
            wants.append(target.role.preflight.name + (f" (shard {shard})" if shard else ""))
    desc = f"probe the host and check role {role}: {', '.join(wants)}" if check else "probe the host (read-only)"
    detail = f"{target.vars['python']} -c <probe snippet> (one round trip, reads only)"
    if install:
        detail += f"; pip-install missing modules into {target.vars['remote_dir']}/venv"
    return Step("probe", desc, detail, "always",
                {"check": check, "install": install, "key": key, "shard": shard,
                 "preflight": check and preflight, "dirs": dirs})


def build(
    targets: list[Target],
    *,
    verify: bool = True,
    script: bool = True,
    key: str | Future[str] | None = None,
    key_unavailable: str | None = None,
    install: bool = False,
    title: str = "deploy",
) -> Plan:
    """Plan for deploy (all three) or one checklist step alone.

    `key` may still be on its way from the keyring (a Future, see secrets.read_key_soon):
    hosts connect and probe meanwhile, and every step that changes a host waits for it
    first, so a keyring failure still changes nothing anywhere.
    """
    release = releases.build() if script else None
    plan = Plan(title, [], private={"release": release, "key": key})
    for i, t in enumerate(targets):
        # The shard this host would get from `fab launch` over the same targets: a role's
        # preflight (the extractor's disk estimate) then checks this host's share only.
        shard = f"{i}/{len(targets)}" if len(targets) > 1 else None
        # A role's preflight may tokenize the whole input (minutes): `fab verify` runs it,
        # deploy does not, so a no-op redeploy stays one cheap round trip; the job itself
        # runs the same check at launch.
        rd = str(t.vars["remote_dir"]).rstrip("/")
        # The folders later steps may create: the probe reports which exist, so creating
        # them costs no stat round trips.
        dirs = releases.parents(f"{rd}/releases/{release.sha12}") if release is not None else []
        if key is not None and (t.role is None or t.role.secret):
            dirs += releases.parents(str(t.vars["key_path"]).rsplit("/", 1)[0])
        steps = [_probe_step(t, verify, install, key is not None, shard, title == "verify",
                             sorted(set(dirs)))]
        if release is not None:
            folder = f"{rd}/releases/{release.sha12}"
            steps.append(Step(
                "upload-release", f"upload payload.pyz ({release.size / 1024:.0f} KiB, sha256 {release.sha12})",
                f"sftp put {folder}/.payload.pyz.tmp-* then rename to {folder}/payload.pyz",
                "unless that release is already there"))
            steps.append(Step(
                "switch-current", f"point {rd}/current at releases/{release.sha12}",
                f"sftp symlink {rd}/.current.tmp-* then rename over {rd}/current (atomic)",
                "unless current already points there"))
            steps.append(Step(
                "prune-releases", f"prune old releases, keeping the last {releases.KEEP_RELEASES}",
                f"rm -rf {rd}/releases/<old>", f"when more than {releases.KEEP_RELEASES} exist"))
        if (key is not None or key_unavailable) and (t.role is None or t.role.secret):
            path = str(t.vars["key_path"])
            folder = path.rsplit("/", 1)[0]
            steps.append(Step(
                "place-key",
                f"place API key {secrets.fingerprint(key)} at {path} (0600)" if isinstance(key, str)
                else f"place API key at {path} (0600)" if key is not None
                else f"place API key at {path} (0600); NOTE: {key_unavailable}",
                f"sftp mkdir {folder} (0700); open .tmp-* O_EXCL mode 0600; write; fsync; rename; stat",
                "unless the host already holds the same key (sha256 compared on the host)"))
        plan.hosts.append(HostPlan(t, steps))
    return plan


def _probe(ctx: HostContext, step: Step) -> str:
    s = ctx.session
    files = {KEY_FILE: str(s.vars["key_path"])} if step.params.get("key") else {}
    role = s.target.role
    check = bool(step.params.get("check"))
    shard = step.params.get("shard")
    preflight = bool(step.params.get("preflight"))
    dirs = list(step.params.get("dirs") or [])
    facts = probe(s, role, files=files, dirs=dirs, deep=check, shard=shard, preflight=preflight)
    ctx.facts = facts
    if not check:
        return Skipped(f"probed (python {'.'.join(map(str, facts.python))})")
    verdict = evaluate(facts, role, s.vars)
    if not verdict.ok and step.params.get("install"):
        _key(ctx)  # pip-installing changes the host: not before the key is known readable
    if not verdict.ok and step.params.get("install") and install_missing(s, verdict, ctx.report):
        facts = probe(s, role, files=files, dirs=dirs, deep=True, shard=shard, preflight=preflight)
        ctx.facts = facts
        verdict = evaluate(facts, role, s.vars)
    report_verdict(ctx.report, verdict, show_all=ctx.plan.title == "verify")
    ctx.report.data["verdict"] = verdict
    if not verdict.ok:
        names = ", ".join(c.name for c in verdict.missing)
        raise HandoffError(f"{s.label}: missing {names} (fixes above); nothing was changed")
    return Skipped(f"verified ({len(verdict.checks)} checks ok)")


def _key(ctx: HostContext) -> str | None:
    """The plan's key, waiting for the keyring read if it is still running; None when the
    plan places no key."""
    key = ctx.plan.private.get("key")
    if isinstance(key, Future):
        try:
            return str(key.result())
        except SecretError:
            # The message (how to store the key) is printed once by the task, not per host.
            raise HandoffError(f"{ctx.session.label}: nothing changed: the API key could not "
                               f"be read from the keyring (see below)") from None
    return None if key is None else str(key)


def _release(ctx: HostContext) -> releases.Release:
    rel = ctx.plan.private.get("release")
    if rel is None:
        raise RemoteError("internal: no release in the plan")
    return rel


def _upload(ctx: HostContext, step: Step) -> str:
    _key(ctx)  # nothing changes on a host before the key is known to be readable
    return releases.upload(ctx.session, ctx.need_facts(), _release(ctx))


def _switch(ctx: HostContext, step: Step) -> str:
    _key(ctx)
    return releases.switch(ctx.session, ctx.need_facts(), _release(ctx))


def _prune(ctx: HostContext, step: Step) -> str:
    _key(ctx)
    return releases.prune(ctx.session, ctx.need_facts(), _release(ctx))


def _place_key(ctx: HostContext, step: Step) -> str:
    key = _key(ctx)
    if not key:
        raise RemoteError("internal: no key in the plan")
    return secrets.place(ctx.session, ctx.need_facts(), key)


HANDLERS: dict[str, Handler] = {
    "probe": _probe,
    "upload-release": _upload,
    "switch-current": _switch,
    "prune-releases": _prune,
    "place-key": _place_key,
}


def run(plan: Plan) -> list[HostReport]:
    return execute(plan, HANDLERS)
