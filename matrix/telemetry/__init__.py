"""Telemetry from deployed hosts in the matrix: the streaming ingest of event files (``ingest``,
which reads them in ``blocks`` checked by ``checks``, through ``arrow``'s buffers) and the SQL a
check reads them with (``queries``, within ``scope``). Judging events is ``qualify.telemetry``'s.
"""
