"""Inventory loading: validation errors name file:line, unknown names list the known ones,
and vars merge in the documented precedence order (docs/configuration.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from handoff.config.inventory import BUILTIN_VARS, load_inventory
from handoff.config.roles import Role
from handoff.errors import InventoryError

ROLES = ["generator", "extractor"]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.yml"
    path.write_text(text)
    return path


def test_seed_inventory_loads() -> None:
    inv = load_inventory(Path(__file__).resolve().parents[3] / "inventory" / "hosts.yml")
    gen = inv.host("gen-1")  # read only: nothing in the tests ever connects to it
    assert gen.address and gen.user == "root" and gen.roles == ("generator",)


def test_sandbox_inventory_loads() -> None:
    inv = load_inventory(Path(__file__).resolve().parents[3] / "inventory" / "sandbox.yml")
    assert all(h.address.startswith("127.") for h in inv.hosts.values())


def test_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts:\n  a: {address: 1.2.3.4\n  b: {}\n")
    with pytest.raises(InventoryError, match=rf"{path}:\d+: invalid YAML"):
        load_inventory(path, ROLES)


def test_unknown_host_key_names_line(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts:\n  a:\n    address: 1.2.3.4\n    prot: 22\n")
    with pytest.raises(InventoryError, match=rf"{path}:4: host 'a': unknown key 'prot'"):
        load_inventory(path, ROLES)


def test_bad_port(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts:\n  a: {address: x, port: seventy}\n")
    with pytest.raises(InventoryError, match="port must be a number"):
        load_inventory(path, ROLES)


def test_duplicate_host_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts:\n  a: {address: x}\n  a: {address: y}\n")
    with pytest.raises(InventoryError, match=rf"{path}:3: duplicate key 'a'"):
        load_inventory(path, ROLES)


def test_unknown_role_lists_known(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts:\n  a: {address: x, roles: [genrator]}\n")
    with pytest.raises(InventoryError, match="unknown role 'genrator'; known roles: generator, extractor"):
        load_inventory(path, ROLES)


def test_unknown_host_lists_known(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, "hosts:\n  a: {address: x}\n  b: {address: y}\n"), ROLES)
    with pytest.raises(InventoryError, match=r"unknown host 'c'.*known hosts: a, b"):
        inv.host("c")


def test_group_with_unknown_member(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts:\n  a: {address: x}\ngroups:\n  g: {hosts: [a, zz]}\n")
    with pytest.raises(InventoryError, match=rf"{path}:4: group 'g': unknown host 'zz'; known hosts: a"):
        load_inventory(path, ROLES)


def test_var_precedence(tmp_path: Path) -> None:
    path = write(tmp_path, """
defaults: {model: m-default, concurrency: 1, python: py-default, max_cost: 1}
hosts:
  a: {address: x, roles: [generator], vars: {model: m-host}}
groups:
  g: {hosts: [a], vars: {model: m-group, concurrency: 3, python: py-group}}
""")
    inv = load_inventory(path, ROLES)
    role = Role(name="generator", path=tmp_path, vars={"concurrency": 2, "max_cost": 2, "job": "gen"})
    v = inv.vars_for(inv.host("a"), role, {"model": None, "max_cost": 9})
    assert v["model"] == "m-host"  # host > group > role > defaults
    assert v["concurrency"] == 3  # group > role > defaults
    assert v["python"] == "py-group"
    assert v["max_cost"] == 9  # task flag wins; a None flag does not override
    assert v["job"] == "gen"  # role default
    assert v["base_url"] == BUILTIN_VARS["base_url"]
    assert v["key_path"] == "~/.handoff/secrets/openrouter.key"


def test_key_path_follows_remote_dir(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, "defaults: {remote_dir: /srv/h/}\nhosts: {a: {}}\n"), ROLES)
    v = inv.vars_for(inv.host("a"), None)
    assert v["key_path"] == "/srv/h/secrets/openrouter.key"
    assert inv.host("a").address == "a"  # no address: the name (may be an ssh_config alias)


@pytest.mark.parametrize("where, value, expected", [
    ("defaults", "concurrency: lots", "var concurrency: expected a whole number >= 1, got 'lots'"),
    ("host", "max_cost: ten", "var max_cost: expected a number >= 0, got 'ten'"),
    ("group", "io_timeout: -1", "var io_timeout: expected a number >= 0.1, got -1"),
    ("host", "python: [a, b]", "var python: expected a non-empty string"),
])
def test_standard_var_types_are_checked_with_file_and_line(tmp_path: Path, where: str, value: str,
                                                           expected: str) -> None:
    text = {"defaults": f"defaults:\n  {value}\nhosts:\n  a: {{address: x}}\n",
            "host": f"hosts:\n  a:\n    address: x\n    vars:\n      {value}\n",
            "group": f"hosts:\n  a: {{address: x}}\ngroups:\n  g:\n    hosts: [a]\n    vars:\n      {value}\n"}[where]
    path = tmp_path / "hosts.yml"
    path.write_text(text)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if value.split(":")[0] + ":" in t)
    with pytest.raises(InventoryError) as exc:
        load_inventory(path, roles=["generator"])
    assert str(exc.value).startswith(f"{path}:{line}: {expected}"), str(exc.value)


def test_numeric_vars_given_as_text_become_numbers(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yml"
    path.write_text("defaults:\n  concurrency: '300'\n  max_cost: 2\nhosts:\n  a: {address: x}\n")
    inv = load_inventory(path, roles=["generator"])
    assert inv.defaults["concurrency"] == 300 and inv.defaults["max_cost"] == 2


@pytest.mark.parametrize("where", ["defaults", "host", "group"])
def test_a_misspelt_var_is_an_error_with_line_and_suggestion(tmp_path: Path, where: str) -> None:
    """`concurency: 8` was ignored in silence: the launch ran 2000 in flight (issue 22 #1)."""
    text = {"defaults": "defaults:\n  concurency: 8\nhosts:\n  a: {address: x}\n",
            "host": "hosts:\n  a:\n    address: x\n    vars:\n      concurency: 8\n",
            "group": "hosts:\n  a: {address: x}\ngroups:\n  g:\n    hosts: [a]\n    vars:\n      concurency: 8\n"}[where]
    path = write(tmp_path, text)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "concurency" in t)
    with pytest.raises(InventoryError) as exc:
        load_inventory(path, ROLES)
    assert str(exc.value).startswith(f"{path}:{line}: unknown var 'concurency'; did you mean "
                                     f"'concurrency'?"), str(exc.value)


def test_role_vars_and_the_vars_roles_read_are_known(tmp_path: Path) -> None:
    """The extractor's own vars (model_dir, ranks, layers, trust_remote_code) are not typos."""
    path = write(tmp_path, "defaults: {model_dir: /m, ranks: 2, layers: '1,2', trust_remote_code: true, "
                           "format: speculators}\nhosts:\n  a: {address: x}\n")
    assert load_inventory(path, ROLES).defaults["model_dir"] == "/m"


def test_misspelt_keys_and_roles_get_a_suggestion(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts:\n  a:\n    address: 1.2.3.4\n    prot: 22\n")
    with pytest.raises(InventoryError, match="unknown key 'prot'; did you mean 'port'"):
        load_inventory(path, ROLES)
    path = write(tmp_path, "hosts:\n  a: {address: x, roles: [genrator]}\n")
    with pytest.raises(InventoryError, match="did you mean 'generator'"):
        load_inventory(path, ROLES)
    path = write(tmp_path, "host:\n  a: {address: x}\n")
    with pytest.raises(InventoryError, match="unknown section 'host'; did you mean 'hosts'"):
        load_inventory(path, ROLES)


def test_the_management_api_is_the_inventorys_defaults_alone(tmp_path: Path) -> None:
    """Issue 31: `management_api` in defaults, else the defaults' base_url, else OpenRouter's;
    never a host's or a group's vars (they are refused, naming the line)."""
    both = load_inventory(write(tmp_path, "defaults: {management_api: 'http://127.0.0.1:7/api/v1/', "
                                          "base_url: 'http://127.0.0.1:8/api/v1'}\nhosts: {}\n"), ROLES)
    assert both.management_api == "http://127.0.0.1:7/api/v1"
    base = load_inventory(write(tmp_path, "defaults: {base_url: 'http://127.0.0.1:8/api/v1'}\n"
                                          "hosts: {a: {vars: {base_url: 'http://127.0.0.1:9/x'}}}\n"), ROLES)
    assert base.management_api == "http://127.0.0.1:8/api/v1"
    bare = load_inventory(write(tmp_path, "hosts: {a: {vars: {base_url: 'http://127.0.0.1:9/x'}}}\n"), ROLES)
    assert bare.management_api == str(BUILTIN_VARS["base_url"]).rstrip("/")
    path = write(tmp_path, "hosts:\n  a:\n    vars:\n      management_api: http://127.0.0.1:9/x\n")
    with pytest.raises(InventoryError, match=rf"{path}:4: var management_api belongs under the "
                                             rf"inventory's `defaults:`"):
        load_inventory(path, ROLES)
