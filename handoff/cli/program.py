"""How `fab` runs handoff's tasks: Fabric's own host flags mean what `--host` means.

Fabric's Executor runs a task once per `-H/--hosts` host, each time with a Connection it
made itself (no host key check, its own ssh_config reading) and, for handoff's tasks, with
`host` unset, so every run fell back to the remembered or inventory hosts: `fab -H a
deploy` deployed to other hosts than a. This Executor instead gives the `-H` value to the
task's `--host` (joined with it when both are given), so the task runs once, over all the
named hosts in parallel, with one summary; it refuses `-H` for a task that acts on no host,
and refuses Fabric's other connection flags (`-i`, `-S`, `-t`, the password prompts), which
handoff does not use: the inventory and ~/.ssh/config say how to connect.

The project's `fabric.yaml` selects it (`tasks.executor_class`). Ctrl-C anywhere in a task
ends `fab` with exit code 130, without a traceback.

Kept free of heavy imports: `fab -l` loads it too.
"""

from __future__ import annotations

import sys
from typing import Any

from fabric import Executor as FabricExecutor
from invoke import Call, Exit, Task

# Fabric's core flags that would configure connections handoff does not make through Fabric.
_IGNORED_CORE = {
    "identity": ("-i/--identity", "set `identity` in the inventory, or IdentityFile in ~/.ssh/config"),
    "ssh-config": ("-S/--ssh-config", "handoff reads ~/.ssh/config as ssh does (`ssh -G`)"),
    "connect-timeout": ("-t/--connect-timeout", "set ConnectTimeout in ~/.ssh/config"),
    "prompt-for-login-password": ("--prompt-for-login-password", "handoff logs in with keys only"),
    "prompt-for-passphrase": ("--prompt-for-passphrase", "load the key into ssh-agent (`ssh-add KEY`)"),
}


def _usage(message: str) -> Exit:
    return Exit(f"error: {message}", code=2)


def merge_hosts(flag: str | None, hosts: str) -> str:
    """`--host` and `-H` together: every host named by either, once, in order."""
    names = [h.strip() for h in f"{flag or ''},{hosts}".split(",") if h.strip()]
    return ",".join(dict.fromkeys(names))


class Executor(FabricExecutor):
    """Fabric's Executor, with `-H/--hosts` given to the task's `--host` (one run)."""

    def _core_value(self, name: str) -> Any:
        try:
            return self.core[0].args[name].value
        except (IndexError, KeyError, AttributeError):
            return None

    def expand_calls(self, calls: list[Any], apply_hosts: bool = True) -> list[Any]:
        for name, (flag, instead) in _IGNORED_CORE.items():
            if self._core_value(name):
                raise _usage(f"{flag} is not used by handoff's tasks; {instead}")
        if self.core is not None and self.core.remainder:
            raise _usage("`fab -- COMMAND` is not a handoff task; run commands on the hosts with "
                         "ssh, or use the tasks (fab -l)")
        hosts = self._core_value("hosts") if apply_hosts else None
        if hosts is not None and not str(hosts).strip(","):
            raise _usage("-H/--hosts is empty: name at least one host")
        expanded: list[Any] = []
        for call in calls:
            if isinstance(call, Task):
                call = Call(task=call)
            expanded.extend(self.expand_calls(call.pre, apply_hosts=False))
            if hosts:
                params = {a.name for a in call.task.get_arguments()}
                if "host" not in params:
                    raise _usage(f"`{call.called_as or call.task.name}` acts on no host: -H/--hosts "
                                 f"does not apply to it")
                call.kwargs["host"] = merge_hosts(call.kwargs.get("host"), str(hosts))
            expanded.append(call)
            expanded.extend(self.expand_calls(call.post, apply_hosts=False))
        return expanded

    def execute(self, *tasks: Any) -> Any:
        try:
            return super().execute(*tasks)
        except KeyboardInterrupt:
            # A task's own Ctrl-C handling already printed what it means; this catches the
            # rest (e.g. while modules load) so `fab` still ends with 130, no traceback.
            print("interrupted", file=sys.stderr)
            raise Exit(code=130) from None
