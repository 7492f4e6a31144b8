"""A fedhet plug-in package: one algorithm (:mod:`.rules`) and one system model
(:mod:`.markov`), each one file."""
