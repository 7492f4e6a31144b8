"""``fedhet bench``: every method of a suite, each tuned under the same trial budget on a
validation split, run over seeds on the test set, in every scenario of the suite; then a
leaderboard. See :mod:`fedhet.bench.suite` for the suite file, :mod:`fedhet.bench.runner`
for how it runs and resumes, :mod:`fedhet.bench.leaderboard` for the statistics."""
