"""Layer 1, what mdb shows of itself: traces and metrics (``telemetry``), the log's
format (``logs``), secrets and control characters kept out of what it shows
(``redaction``), and a snapshot of a container's health (``health``)."""
