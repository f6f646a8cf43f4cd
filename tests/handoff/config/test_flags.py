"""The numeric vars' one home (handoff.config.flags.VARS): one rule and one message per var,
whether the value comes from the inventory, a task flag or a host's key settings."""

from __future__ import annotations

import pytest

from handoff.config import flags, inventory
from handoff.defaults import BUILTIN_VARS
from handoff.errors import InventoryError, UsageError
from handoff.host.remote_code import jobs


@pytest.mark.parametrize("raw", ["-1", "ten", "nan", True])
def test_max_cost_has_one_rule_and_one_message_for_flag_and_var(raw: object) -> None:
    with pytest.raises(UsageError) as by_flag:
        flags.var("max_cost", raw, flag="--max-cost")
    with pytest.raises(InventoryError) as by_var:
        inventory.check_var("max_cost", raw, "hosts.yml:3")
    assert str(by_flag.value) == f"--max-cost: expected a number >= 0, got {raw!r}"
    assert str(by_var.value) == f"hosts.yml:3: var max_cost: expected a number >= 0, got {raw!r}"


def test_every_var_the_inventory_checks_has_a_rule() -> None:
    assert set(inventory._NUMBERS) <= set(flags.VARS)
    assert flags.var("max_cost", "0") == 0.0 and flags.var("max_cost", None) is None


def test_key_ttl_must_be_more_than_zero() -> None:
    with pytest.raises(UsageError, match=r"h1: var key_ttl_hours: expected a number > 0, got 0"):
        flags.var("key_ttl_hours", 0, where="h1")
    assert flags.var("key_ttl_hours", "0.5", where="h1") == 0.5


def test_the_start_watch_default_is_the_hosts_own() -> None:
    """The var's default and the one remote_code/jobs.py uses when none is given agree."""
    assert BUILTIN_VARS["start_watch_s"] == jobs.START_WATCH_S
