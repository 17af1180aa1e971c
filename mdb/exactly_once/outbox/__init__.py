"""The outbox: messages written in the same database transaction as the writes they stand for,
dispatched once it committed, and deleted once a broker confirmed them: by the next
transaction of a run (``Dispatcher.sent``, a statement in it rather than a transaction of its
own), or before the next sweep claims rows.

Each row keeps the message's ``mdb_id``: a row dispatched twice (its process died after the
send and before the delete) reaches its destination twice with one id, which a downstream
exactly-once listener drops. A row is leased to the process dispatching it (``owner``,
``lease_until``): the process that wrote it dispatches it at once; a row whose lease ran out
(its process died, or its broker was down) is taken by whichever process of the app sweeps
next. A row the broker refuses goes to its error destination with the reason, never round
and round. A body larger than mdb sends (``MAX_BODY_BYTES``) is refused before its row is
written: a broker refuses it only by dropping the connection, which is no refusal, and the row
would be sent again at every sweep, holding up the rows behind it.

* ``rows``: a row (``Row``) and the statements the writer and the dispatcher share;
* ``writer``: ``Writer``, the sends of one transaction written as rows in it;
* ``dispatcher``: ``Dispatcher``, the rows sent in order, leased while they are sent, swept
  when their lease ran out, deleted once sent;
* ``producer_outbox``: ``Outbox``, the same for a producer outside a handler, in the caller's
  own transaction (store-and-forward while a destination's brokers are down).
"""
