"""A fedhet plug-in package: one algorithm (:mod:`.rules`), one system model
(:mod:`.markov`) and one dataset (:mod:`.csv_data`), each one file."""
