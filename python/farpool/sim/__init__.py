"""farpool's discrete-event simulator of interconnects and memory pools (on SimPy).

Modules: ``fabric`` (links, buffers, back-pressure, topologies), ``nodes`` (traffic
generators, far-memory cache, FCFS servers), ``mixes`` (seed 003's traffic mixes, farpool's
transactions), ``sci`` (seed 003's SCI ring and Fig. 8), ``memscale`` (MEMSCALE Fig. 5),
``txn`` (RSI and sharded 2PC as processes), ``calibrate`` (this machine, from measured op
costs), ``predict`` (clusters of 8..4096 nodes), ``cli`` (``farpool-sim``) and
``experiments`` (the runs that write ``bench/results/sim_*``). See docs/simulator.md.
"""
