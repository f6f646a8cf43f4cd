"""The trust boundary (handoff.untrusted): what a host answers, checked before it is used
or shown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from handoff.host import untrusted as u

ESC = "\x1b"


# -- visible ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "shown"), [
    (f"{ESC}]52;c;SGk=\a", "\\x1b]52;c;SGk=\\x07"),
    (f"a{ESC}[2Jb", "a\\x1b[2Jb"),
    ("nul\x00here", "nul\\x00here"),
    ("csi\x9b31m", "csi\\x9b31m"),
    ("bidi\u202eevil", "bidi\\u202eevil"),
    ("del\x7f", "del\\x7f"),
    ("tab\tand\nnewline", "tab\\x09and\\x0anewline"),
    ("plain text, ünïcödé ✓", "plain text, ünïcödé ✓"),
])
def test_visible_escapes_every_control_character(raw: str, shown: str) -> None:
    assert u.visible(raw) == shown
    assert ESC not in u.visible(raw) and "\x00" not in u.visible(raw)


def test_visible_keeps_newlines_when_asked_and_cuts_long_text() -> None:
    assert u.visible("a\nb", newlines=True) == "a\nb"
    assert u.visible("x" * 50, 10) == "x" * 10 + "… (40 more characters)"
    assert u.visible(123) == "123"


# -- loads and typed readers ------------------------------------------------------------------------

def test_loads_reads_non_finite_numbers_as_none() -> None:
    assert u.loads('{"a": NaN, "b": Infinity, "c": -Infinity, "d": 1e400, "e": 1.5, "f": 2}') == {
        "a": None, "b": None, "c": None, "d": None, "e": 1.5, "f": 2}
    with pytest.raises(ValueError):
        u.loads("not json")


@pytest.mark.parametrize(("value", "minimum", "expected"), [
    (1, None, 1.0), (2.5, None, 2.5), (-1000, 0, None), (-1000, None, -1000.0),
    (True, None, None), ("5", None, None), (float("inf"), None, None), (float("nan"), None, None),
    (10 ** 400, None, None), (None, None, None), ([], None, None),
])
def test_number(value: object, minimum: float | None, expected: float | None) -> None:
    assert u.number(value, minimum=minimum) == expected


def test_count_integer_text_flag_strings() -> None:
    assert u.count(5) == 5 and u.count(5.0) == 5 and u.count(5.5) is None and u.count(-1) is None
    assert u.count("5") is None and u.count(False) is None
    assert u.integer(-15) == -15
    assert u.text("abc") == "abc" and u.text(5) is None
    assert u.text("x" * 10, 4) == "xxxx… (6 more characters)"
    assert u.flag(True) is True and u.flag(1) is None
    assert u.strings(["a", 1, "b"]) == ["a", "b"] and u.strings("a") == []


def test_status_keeps_good_fields_and_names_the_bad_ones() -> None:
    raw = {"state": "running", "total": "x", "rate_rps": "fast", "done": "5", "failed": 1,
           "cost": -1000, "tokens_per_s": 12.5, "bad_line_samples": 5, "last_error": "boom",
           "exit_code": -15, "something_else": {"deep": 1}}
    st, problems = u.status(raw)
    assert st == {"state": "running", "failed": 1, "tokens_per_s": 12.5, "last_error": "boom",
                  "exit_code": -15}  # the nested unknown field is dropped
    named = " ".join(problems)
    for field in ("total", "rate_rps", "done", "cost", "bad_line_samples"):
        assert field in named
    assert u.status(None) == (None, [])
    assert u.status([1, 2]) == (None, ["status.json is not a JSON object (list)"])


def test_status_samples_are_typed_and_bounded() -> None:
    st, _ = u.status({"bad_line_samples": [{"line": 3, "reason": "bad"}, "x", {"line": "y"}]
                      + [{"line": 1, "reason": "r"}] * 100})
    assert st is not None
    samples = st["bad_line_samples"]
    assert samples[0] == {"line": 3, "reason": "bad"} and samples[1] == {"line": None, "reason": None}
    assert len(samples) <= u.MAX_SAMPLES


def test_meta_keeps_plain_fields() -> None:
    meta, problems = u.meta({"shard": "0/2", "input_sha256": "ab" * 32, "input": "/x",
                             "temperature": 0.5, "deep": {"x": 1}, "hosts": "two"})
    assert meta == {"shard": "0/2", "input_sha256": "ab" * 32, "input": "/x", "temperature": 0.5}
    assert problems and "hosts" in problems[0]


def test_status_keeps_unknown_scalars_and_both_time_forms() -> None:
    st, problems = u.status({"started": "2026-12-01T10:00:00Z", "updated": 1796057018.4,
                             "bytes_written": 10, "format": "native", "ranks": [1],
                             "errors_by_kind": {"x": 1}, "weird": float("inf")})
    assert st == {"started": "2026-12-01T10:00:00Z", "updated": 1796057018.4,
                  "bytes_written": 10, "format": "native", "errors_by_kind": {"x": 1}}
    assert problems == []


# -- names ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["../../x", "/etc/passwd", "a/b", ".hidden", "", "a\x00b",
                                  f"j{ESC}[2J", "x" * 300, None, 5, ".."])
def test_job_names_refused(name: object) -> None:
    with pytest.raises(u.Untrusted):
        u.job_name(name)


def test_job_names_accepted() -> None:
    assert u.job_name("B3-gen_1.v2") == "B3-gen_1.v2"


@pytest.mark.parametrize("rel", ["/abs/path", "../../up", "a/../../b", "a//b", "./a", "a/\x1bb",
                                 "", "a/..", None])
def test_rel_paths_refused(rel: object) -> None:
    with pytest.raises(u.Untrusted):
        u.rel_path(rel)


def test_rel_paths_accepted() -> None:
    assert u.rel_path("shards/output.jsonl") == "shards/output.jsonl"
    assert u.rel_path(".output.jsonl.tmp") == ".output.jsonl.tmp"


def test_inside_stays_under_its_root(tmp_path: Path) -> None:
    root = tmp_path / "dest"
    root.mkdir()
    assert u.inside(root, "a/b.jsonl") == root / "a" / "b.jsonl"
    with pytest.raises(u.Untrusted):
        u.inside(root, "../x")
    (root / "link").symlink_to(tmp_path)
    with pytest.raises(u.Untrusted, match="symlink"):
        u.inside(root, "link/x")
    # A root that is itself reached through a symlink is fine (the user chose it).
    alias = tmp_path / "alias"
    alias.symlink_to(root)
    assert u.inside(alias, "ok") == alias / "ok"


# -- sizes --------------------------------------------------------------------------------------

def test_capped_refuses_past_its_limit_with_the_numbers() -> None:
    cap = u.Capped(10, "the answer of jobs")
    cap.add(b"12345")
    with pytest.raises(u.TooLarge, match=r"the answer of jobs is too large: more than 10 B"):
        cap.add(b"678901")
    assert bytes(cap.data) == b"12345"


def test_tail_keeps_the_end() -> None:
    tail = u.Tail(4)
    for chunk in (b"abcdef", b"ghij", b"kl"):
        tail.add(chunk)
    assert tail.bytes() == b"ijkl" and tail.seen == 12


def test_lines_bounds_every_line_and_never_buffers_the_rest() -> None:
    lines = u.Lines(limit=8)
    out = lines.feed(b"short\nthis line is long")
    assert out == ["short"]
    assert len(lines.buf) <= 8
    out = lines.feed(b" and longer" * 1000 + b"\nnext\n")
    assert out[0].startswith("this lin") and "more bytes of this line not shown" in out[0]
    assert out[1] == "next"
    assert lines.feed(b"tail") == [] and lines.rest() == ["tail"]


def test_mb() -> None:
    assert u.mb(1 << 40) == "1.1 TB" and u.mb(8 << 20) == "8.4 MB" and u.mb(12) == "12 B"


def test_loads_of_a_forged_status_never_yields_infinity() -> None:
    st, problems = u.status(u.loads(json.dumps({"total": float("inf"), "cost": float("nan")})))
    assert st == {} and problems == []


# -- the bounded reader (issue 31) ----------------------------------------------------------------

def test_format_characters_and_surrogates_are_shown_like_control_characters() -> None:
    """`prompts\u200b` must not read as `prompts`; every Unicode format character (Cf) and a
    lone surrogate are escaped."""
    import unicodedata

    assert u.visible("prompts\u200b") == "prompts\\u200b"
    assert u.visible("x\ud800y") == "x\\ud800y" and u.visible("tag\U000e0041") == "tag\\U000e0041"
    missed = [c for c in range(0x110000) if unicodedata.category(chr(c)) == "Cf"
              and not u.has_control(chr(c))]
    assert missed == []


@pytest.mark.parametrize(("raw", "why"), [
    ("[" * 100_000 + "]" * 100_000, "nested deeper than 32"),
    ("[" * 33 + "]" * 33, "nested deeper than 32"),
    ('{"n": 1' + "0" * 5000 + "}", "a number of 5001 digits"),
    ('{"n": 1.' + "5" * 200 + "}", "a number of 202 characters"),
    ('{"s": "' + "x" * (2 << 20) + '"}', "a string of"),
    ("[" + ",".join(["1"] * 300_000) + "]", None),
    ("not json", "is not JSON"),
])
def test_loads_refuses_what_would_cost_the_workstation(raw: str, why: str | None) -> None:
    if why is None:
        assert len(u.loads(raw)) == 300_000
        with pytest.raises(u.Untrusted, match="more than 1000 values"):
            u.loads(raw, limits=u.Limits(max_values=1000))
        return
    with pytest.raises(u.Untrusted, match=why):
        u.loads(raw)


def test_loads_caps_bytes_and_repairs_lone_surrogates() -> None:
    with pytest.raises(u.TooLarge):
        u.loads("[" + "1," * 600_000 + "1]", "status.json", u.SMALL_FILE)
    assert u.loads('{"s": "\\ud800x\\ud83d\\ude00"}') == {"s": "\ufffdx\U0001f600"}


def test_declared_shapes_bound_the_shard_layout_a_host_gives() -> None:
    """job.json's shard and host count: only what handoff could have launched (at most
    MAX_SHARD_HOSTS), so no count from a host ever sizes a loop or a set."""
    meta, problems = u.meta({"shard": "0/100000000000", "hosts": 1e15, "shard_hosts": ["a"],
                             "started": 5.0, "job": "j", "other": "kept"})
    assert meta == {"shard_hosts": ["a"], "started": 5.0, "job": "j", "other": "kept"}
    assert len(problems) == 2 and "shard" in problems[0] and "hosts" in problems[1]
    assert u.shard_spec("3/4") == (3, 4) and u.shard_spec("4/4") is None
    assert u.shard_spec("0/" + "7" * 5000) is None and u.shard_spec(7) is None
    status, problems = u.status({"state": "running", "done": 3, "extra_field": 1.5})
    assert status == {"state": "running", "done": 3, "extra_field": 1.5} and problems == []
    shape, _ = u.read_shape(u.StatusFile, {"done": "3"}, "status.json")
    assert shape is not None and shape.done is None


def test_batch_counts_are_whole_counts_and_named_states() -> None:
    good = {"batches": 3, "live": 1, "requests": 12, "live_requests": 4, "completed": 7,
            "failed": 1, "by_state": {"completed": 2, "in_progress": 1}, "extra": "kept out"}
    got = u.batch_counts(good)
    assert got == {k: v for k, v in good.items() if k != "extra"}
    for bad in ({"live": -1}, {"batches": "3"}, {"by_state": ["x"]},
                {"by_state": {"a": 1.5}}, [], None, {"failed": float("nan")}):
        assert u.batch_counts(bad) is None, bad
    st, problems = u.status({"state": "running", "batches": {"live": "many"}})
    assert st == {"state": "running"} and problems and "batches" in problems[0]
    shown = u.batch_counts({"by_state": {"\x1b[31mred": 1}})
    assert shown == {"by_state": {"?[31mred": 1}}
