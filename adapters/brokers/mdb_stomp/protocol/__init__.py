"""STOMP 1.2 on one connection: ``wire`` (stomp.py's connection bridged into anyio), the
frames written and read (``frames``, ``inbound``, ``reading``, ``listener``,
``frame_logs``), ``receipts``, ``heartbeats``, ``tls``, why a connection could not be
opened (``connect_failure``) and the headers a broker surely takes (``limits``)."""
