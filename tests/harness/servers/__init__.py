"""Private servers for tests, each on its own ports and in its own directory, stopped by
PID: what every one shares (``process``), brokers (``activemq``, ``activemq_pair``,
``rabbitmq``, ``rabbitmq_cluster``, ``brokers``, ``private_activemq``), databases
(``postgresql``, ``mariadb``, ``database_server``, ``databases``), a Spark cluster
(``spark_cluster``), a private network (``netns``) and TLS certificates
(``certificates``)."""
