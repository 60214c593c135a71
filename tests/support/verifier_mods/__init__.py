"""Misbehaving verifiers for actor robustness tests: each passes its self-test (run in the actor's main
process) and misbehaves only inside scoring worker processes."""
