import io
import logging

from payload.redact import RedactingFilter, RedactingStream, Redactor

KEY = "sk-or-v1-" + "ab12" * 16


def test_redact_masks_every_occurrence_and_nested_values():
    r = Redactor()
    r.add(KEY)
    out = r.redact(f"key={KEY} again {KEY}")
    assert KEY not in out and "sk-or-v1-****" in out
    assert KEY not in repr(r.redact_any({"a": [KEY, {"b": KEY}], "n": 1}))


def test_logging_filter_redacts_args_and_tracebacks():
    r = Redactor()
    r.add(KEY)
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.addFilter(RedactingFilter(r))
    log = logging.getLogger("t-redact")
    log.addHandler(handler)
    log.propagate = False
    log.warning("header %s", KEY)
    try:
        raise RuntimeError(f"boom {KEY}")
    except RuntimeError:
        log.exception("failed")
    assert KEY not in buf.getvalue()
    assert "boom" in buf.getvalue()


def test_stream_wrapper():
    r = Redactor()
    r.add(KEY)
    buf = io.StringIO()
    RedactingStream(buf, r).write(f"x {KEY}\n")
    assert KEY not in buf.getvalue()
