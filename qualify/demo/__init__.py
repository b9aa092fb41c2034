"""``qualify demo``: the story (``story``), its telemetry (``telemetry``) and rollouts
(``rollout``), and the committed model files it runs on (``assets``)."""
