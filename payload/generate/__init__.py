"""`python -m payload generate`: the resumable, exactly-once async generator.

Modules, lowest first (each imports only from those above it and from the common modules
in `payload/`):
sse (the event-stream reader) · client (one attempt: the request body, the error taxonomy
and answer shapes) · streaming (one streamed attempt, its timeouts' watchdog) · batchapi
(the OpenAI Batch API's calls, typed) · outage (the outage breaker) · evidence (what
throttled answers say) · slots (the slot gate: waiters, the outage probe) · limiter (slow
start, throttling, capacity) · budget (--max-cost from expected costs) · systematic (early
stop on one error for every prompt) · journal (resume index, single writer) · inputs (the
input survey: valid records, bad lines, totals) · turns (`--turns last|all`: the turns
regenerated, their histories, the turn journal) · batchstate (the batch ledger,
batches.json) · preflight (endpoint filter check, prices) · progress (counters, status
file, progress display) · settings (what a run was asked, checked) · stop (the one
decision to stop) · recorder (costs and records) · attempts (one prompt through its
attempts) · batch (`--mode batch|auto`: batches submitted, polled, collected by the
recorder) · smoke (`python -m payload smoke`: one request, the facts an engineer checks) ·
run (the orchestrator).
"""
