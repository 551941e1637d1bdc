"""farpool's Python side: the simulator (`farpool.sim`) and, later, the benchmark harness.

The C++ core (pool, db, tier, bench) lives in `src/`; this package holds tools that read its
measured results and model clusters larger than the ones we can run.
"""
