"""``mdb dlq``: what reached an error destination, listed, shown, replayed or purged
(``failed``, the library: docs/failed-messages.md; a message there is ``failed_message``, which
of them an operation takes ``selection``, what a replay sends and where ``replays``), and the
command (``failed_command``)."""
