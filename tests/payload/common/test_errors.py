"""Every expected failure of the payload is a `payload.errors.PayloadError` whose class
fixes the exit code, and the command entry maps them in one place (payload/cli.py)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import payload
from payload import cli
from payload.errors import (
    BadRecord,
    BudgetReached,
    ExitCode,
    KeyFileError,
    PayloadError,
    PreflightRefused,
    Stopped,
    UsageError,
)

# Raised and caught inside one module, never shown to a user as an exception.
INTERNAL = {"payload.generate.journal.WriteFailed",  # an OSError the recorder turns into a stop
            "payload.generate.batch._Interrupted",  # a batch run's retry cut by its stop
            "payload.generate.streaming.StreamTimeout"}  # a stream's read, ended by its watchdog


@pytest.mark.parametrize(("cls", "code"), [
    (UsageError, ExitCode.USAGE), (KeyFileError, ExitCode.USAGE), (BadRecord, ExitCode.USAGE),
    (PreflightRefused, ExitCode.USAGE), (Stopped, ExitCode.STOPPED),
    (BudgetReached, ExitCode.STOPPED)])
def test_each_error_carries_its_exit_code(cls, code):
    assert issubclass(cls, PayloadError) and cls.exit_code == code
    if issubclass(cls, UsageError):
        assert issubclass(cls, ValueError)  # as BadRecord and UsageError always were


def test_every_exception_class_of_the_payload_is_under_the_base():
    """Outside the extractor (its own package, checked by its tests), no module defines an
    exception a caller would have to catch by name."""
    strays = []
    for info in pkgutil.walk_packages(payload.__path__, "payload."):
        if info.name.startswith("payload.extract") or info.name == "payload.__main__":
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, BaseException)
                    and obj.__module__ == info.name and f"{info.name}.{name}" not in INTERNAL
                    and not issubclass(obj, PayloadError)):
                strays.append(f"{info.name}.{name}")
    assert strays == []


def test_the_cli_maps_any_payload_error_to_its_code(monkeypatch, capsys):
    def refuse(args):
        raise PreflightRefused("the provider filter leaves no endpoint; change --provider")
    monkeypatch.setattr(cli, "_smoke", refuse)
    assert cli.main(["smoke"]) == 2
    assert capsys.readouterr().err == (
        "error: the provider filter leaves no endpoint; change --provider\n")

    def spent(args):
        raise BudgetReached("budget $1 reached")
    monkeypatch.setattr(cli, "_smoke", spent)
    assert cli.main(["smoke"]) == 3


def test_a_refused_key_file_is_exit_2_through_the_base(tmp_path, capsys):
    missing = tmp_path / "nope.key"
    assert cli.main(["smoke", "--api-key-file", str(missing)]) == 2
    assert f"error: API key file {missing} does not exist" in capsys.readouterr().err
