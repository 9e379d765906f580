"""The trace replay's simulation (what ``kvserve bench trace`` replays, the live pool apart):
a trace's requests and their block chains, and the shared pool's hits (``replay``), the
simulated workers (``workers``) and their KV events (``events``), session policies
(``policies``), the cluster model and its placement by the router's own policies
(``cluster``), the sweep of locality weights (``sweep``) and the generated traces
(``gen``). The live replays through a real pool stay with the benchmark
(:mod:`kvserve.bench.trace`: ``pool.py``, ``ssd.py``)."""
