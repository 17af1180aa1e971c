"""Layer 5, the container: its lifecycle and stop order (``container``), its pool slots
(``slots``), finding the application and wiring its dependencies (``wiring``), and
what the command prints of it (``report``)."""
