"""What differs per broker: the ``Dialect`` (``dialect``) and one per broker
(``activemq``, ``rabbitmq``); whether an ActiveMQ holds delayed messages back
(``scheduler``); how a transaction settles where the broker's are not atomic
(``confirmed``: RabbitMQ)."""
