"""`python -m payload generate`: the resumable, exactly-once async generator.

client (one attempt + error taxonomy) · journal (resume index, single writer) ·
budget (--max-cost) · limiter (shared pause + AIMD window) · preflight (endpoint filter
check) · progress (status file, progress display) · run (the orchestrator).
"""
