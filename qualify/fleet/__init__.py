"""The fleet on Ray (an optional extra, imported here only): the cluster a host joins and the
commands' entry points (``cluster``), the driver's loop (``driver``) and a class's task on its
host (``host``)."""
