"""The `fab` program: Fabric's, owned by handoff, so every usage error is exit 2 with a fix.

`Program` is Fabric's own `Fab` with handoff's Executor, installed as the venv's `fab`
(pyproject `[project.scripts]`, replacing Fabric's script of the same name), so users still
type `fab deploy`. What it adds to Fabric's:

- every usage error (an unknown flag `--hsot`, an unknown task `deplyo`, a flag given twice
  `--host a --host b`, a flag value of the wrong type `-t x`) ends with exit 2 and, where
  one is close, "did you mean"; invoke's own answer was exit 1, or a traceback;
- the project folder (the fabfile's) is the current folder or the nearest one above it,
  else `--project DIR` or `$HANDOFF_PROJECT`; outside any, the error says so;
- Ctrl-C anywhere (while modules load too) ends with 130, without a traceback.

`Executor`: how `fab` runs handoff's tasks: Fabric's own host flags mean what `--host` means.

Fabric's Executor runs a task once per `-H/--hosts` host, each time with a Connection it
made itself (no host key check, its own ssh_config reading) and, for handoff's tasks, with
`host` unset, so every run fell back to the remembered or inventory hosts: `fab -H a
deploy` deployed to other hosts than a. This Executor instead gives the `-H` value to the
task's `--host` (joined with it when both are given), so the task runs once, over all the
named hosts in parallel, with one summary; it refuses `-H` for a task that acts on no host,
and refuses Fabric's other connection flags (`-i`, `-S`, `-t`, the password prompts), which
handoff does not use: the inventory and ~/.ssh/config say how to connect.

The project's `fabric.yaml` selects the Executor too (`tasks.executor_class`), for a `fab`
that is Fabric's own. Ctrl-C anywhere in a task ends `fab` with exit code 130, without a
traceback.

Kept free of heavy imports: `fab -l` loads it too.
"""

from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path
from typing import Any

from fabric import Config
from fabric import Executor as FabricExecutor
from fabric.main import Fab
from invoke import Argument, Call, Exit, ParseError, Task

# Fabric's and invoke's core flags that handoff's tasks refuse: they would configure
# connections handoff does not make through Fabric, or shell commands run through invoke,
# which no task runs (`-R/--dry` would have looked like a dry run and changed the hosts all
# the same). Refused with what to do instead, and left out of `fab --help`.
_IGNORED_CORE = {
    "identity": ("-i/--identity", "set `identity` in the inventory, or IdentityFile in ~/.ssh/config"),
    "ssh-config": ("-S/--ssh-config", "handoff reads ~/.ssh/config as ssh does (`ssh -G`)"),
    "connect-timeout": ("-t/--connect-timeout", "set ConnectTimeout in ~/.ssh/config"),
    "prompt-for-login-password": ("--prompt-for-login-password", "handoff logs in with keys only"),
    "prompt-for-passphrase": ("--prompt-for-passphrase", "load the key into ssh-agent (`ssh-add KEY`)"),
    "prompt-for-sudo-password": ("--prompt-for-sudo-password", "no task runs sudo"),
    "dry": ("-R/--dry", "the tasks that change hosts take --dry-run (e.g. fab launch --dry-run)"),
    "echo": ("-e/--echo", "no task runs local shell commands through invoke; --dry-run shows "
                          "what a task would run on the hosts"),
    "pty": ("-p/--pty", "no task runs shell commands through invoke"),
    "hide": ("--hide", "no task runs shell commands through invoke"),
    "warn-only": ("-w/--warn-only", "no task runs shell commands through invoke"),
    "command-timeout": ("-T/--command-timeout", "set ConnectTimeout in ~/.ssh/config, or the "
                                                "io_timeout var for a stalled host"),
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


# --- the program ----------------------------------------------------------------------------

PROJECT_ENV = "HANDOFF_PROJECT"
_NO_IDEA = "No idea what "


def _close(word: str, known: list[str]) -> str:
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


class Program(Fab):
    """Fabric's `fab`, with handoff's Executor, usage errors as exit 2, and `--project`."""

    def core_args(self) -> list[Argument]:
        return [*super().core_args(), Argument(
            names=("project",),
            help=f"the handoff project folder (the one with fabfile.py); default: this folder "
                 f"or the nearest above it, else ${PROJECT_ENV}")]

    def print_version(self) -> None:
        """`handoff X` first (what a bug report needs), then Fabric's own lines."""
        import handoff

        print(f"handoff {handoff.__version__}")
        super().print_version()

    def print_help(self) -> None:
        """Fabric's help without the core flags handoff refuses (`_IGNORED_CORE`)."""
        refused = {f for flag, _ in _IGNORED_CORE.values() for f in flag.split("/")}
        tuples = [(name, text) for name, text in self.initial_context.help_tuples()
                  if not refused & {part.split("=")[0].split("[")[0] for part in name.split(", ")}]
        print(f"Usage: {self.binary} [--core-opts] task1 [--task1-opts] ... taskN [--taskN-opts]")
        print("")
        print("Core options (handoff's tasks: fab -l; a task's flags: fab --help TASK):")
        print("")
        self.print_columns(tuples)
        if self.namespace is not None:
            self.list_tasks()

    def load_collection(self) -> None:
        given = self.args["project"].value or os.environ.get(PROJECT_ENV)
        if given and not self.args["search-root"].value:
            folder = Path(given).expanduser()
            if not (folder / "fabfile.py").is_file():
                flag = "--project" if self.args["project"].value else f"${PROJECT_ENV}"
                raise _usage(f"{flag} {given}: no fabfile.py there; give the handoff project "
                             f"folder (the clone, with fabfile.py and inventory/)")
            self.args["search-root"].value = str(folder)
        try:
            super().load_collection()
        except Exit as exc:
            if "Can't find any collection" not in str(exc.message or ""):
                raise
            raise _usage(f"no handoff project here: no fabfile.py in {Path.cwd()} or any folder "
                         f"above it; cd into the project, or give --project DIR (or "
                         f"{PROJECT_ENV}=DIR)") from None

    def _flags_of(self, context: Any) -> list[str]:
        names = list(getattr(context, "flags", {}) or {}) if context is not None else []
        return names + list(self.initial_context.flags)

    def _task_names(self) -> list[str]:
        collection = getattr(self, "collection", None)
        if collection is None:
            return []
        return [*collection.task_names, *(a for al in collection.task_names.values() for a in al)]

    def _repeated_flag(self) -> str | None:
        """A flag given twice (`--host a --host b`): invoke reads the second value as a task."""
        seen: set[str] = set()
        for token in self.argv[1:]:
            if token == "--":
                break
            if token.startswith("-"):
                name = token.split("=", 1)[0]
                if name in seen and name not in ("--input",):  # --input may repeat
                    return name
                seen.add(name)
            elif token in self._task_names():
                seen = set()  # a new task: its flags start afresh
        return None

    def usage_error(self, exc: ParseError) -> Exit:
        """invoke's parse error as handoff's: what was wrong, the fix, exit 2."""
        text = str(exc)
        twice = self._repeated_flag()
        if twice:
            hint = (" (several hosts go in one: --host a,b)" if twice in ("--host", "-H", "--hosts")
                    else "")
            return _usage(f"{twice} is given twice; give it once{hint}")
        if text.startswith(_NO_IDEA) and text.endswith(" is!"):
            word = text[len(_NO_IDEA) + 1:-5]
            if word.startswith("-"):
                known = self._flags_of(getattr(exc, "context", None))
                return _usage(f"unknown flag {word!r}{_close(word, known)} (the task's flags: "
                              f"fab --help TASK)")
            return _usage(f"unknown task {word!r}{_close(word, self._task_names())} (the tasks: "
                          f"fab -l)")
        return _usage(f"{text} (see fab --help, or fab --help TASK)")

    def parse_core(self, *args: Any, **kwargs: Any) -> None:
        try:
            super().parse_core(*args, **kwargs)
        except ValueError as exc:  # `-t x`: invoke's int() of the value, a traceback before
            raise _usage(f"a flag's value has the wrong type ({exc}); see fab --help") from None
        except ParseError as exc:
            raise self.usage_error(exc) from None

    def parse_tasks(self) -> None:
        try:
            super().parse_tasks()
        except ValueError as exc:
            raise _usage(f"a flag's value has the wrong type ({exc}); see fab --help TASK") from None
        except ParseError as exc:
            raise self.usage_error(exc) from None

    def parse_cleanup(self) -> None:
        try:
            super().parse_cleanup()
        except ParseError as exc:  # `fab --help deplyo`
            raise self.usage_error(exc) from None

    def run(self, argv: Any = None, exit: bool = True) -> None:
        try:
            super().run(argv, exit)
        except KeyboardInterrupt:  # while modules load: invoke's own answer is exit 1
            print("interrupted", file=sys.stderr)
            sys.exit(130)
        except BrokenPipeError:  # `fab -l | head`: the reader is gone, nothing to tell it
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(1)


def make_program() -> Program:
    from fabric import __version__ as fabric_version

    return Program(name="Fabric", binary="fab", binary_names=["fab"], version=fabric_version,
                   executor_class=Executor, config_class=Config)


def main() -> None:
    """The `fab` console script."""
    make_program().run()
