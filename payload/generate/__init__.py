"""`python -m payload generate`: the resumable, exactly-once async generator.

client (one attempt + error taxonomy and answer shapes) · inputs (the input survey: valid
records, bad lines, totals) · journal (resume index, single writer) · budget (--max-cost
from expected costs) · limiter (slow start, throttling, the slots) · outage (the outage
breaker) · systematic (early stop on one error for every prompt) · preflight (endpoint
filter check, prices) · progress (status file, progress display) · run (the orchestrator).
"""
