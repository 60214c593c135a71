"""The fleet simulator: a discrete-event model of a brorl job on a fleet we do not have (many actor and
learner GPUs, actors failing), to predict samples/s, the learner's waiting share, actors' idle share and
staleness before renting the GPUs (`brorl simulate-fleet`).

Lives here: the simulation (`sim.py`) and its calibration from our benchmarks' measured rates
(`calibration.py`). The admission and freshness rules are the learner's own (`learner.batching`:
`Dispatcher`, `Admission`), imported, not re-implemented. Imports the learner and config; nothing
imports it but the command line.
"""
