"""Release manifests from the matrix: generating and publishing them (``generate``), publishing
as a transaction (``publishing``), the verdicts under today's project (``current``) and coverage
and the CI gate (``coverage``)."""
