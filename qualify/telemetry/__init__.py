"""Watching the deployed path: the commands' reads of the matrix (``watch``), the pure judgement
(``check``), which manifest version an event is judged against and lagging hosts (``timeline``),
what must be re-run (``staleness``) and the text for people (``render``)."""
