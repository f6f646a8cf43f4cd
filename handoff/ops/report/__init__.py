"""`fab report`: what a run did, as one self-contained HTML page per job and one for the run,
built from the files `fab fetch` brought (records, metrics, status), and the same pages
served live from the hosts (`--watch`).

The modules, lowest first (each imports only those before it):

- `series`: a host's metrics.jsonl as a time series (bounded, every field optional);
- `records`: a job's records read once, streamed: compact columns, counts, the answers
  browser's bounded sample;
- `features`: an extractor job's manifests and mismatches;
- `runs`: the jobs under a fetch's folder, each job's host copies, the summary figures;
- `plots`: the figures, matplotlib to inline SVG;
- `page`: the HTML (escaping, the summary's JSON block, the answers browser);
- `build`: the pages written (`DIR/report.html`, `DIR/<job>/report.html`);
- `live`: `--watch`: the hosts read (one round trip each per refresh) and the pages served
  on 127.0.0.1.
"""

__all__ = ["build", "features", "live", "page", "plots", "records", "runs", "series"]
