"""Candidate variants of the baseline: the converters (``convert``) and ``qualify candidates``,
which makes them, stores them with their lineage and adds them to the project (``make``)."""
