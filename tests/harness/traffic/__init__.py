"""What tests send and read, and what they check it against: messages in and out
(``messages``), loads sent while faults happen (``load_producer``), a producer that is
not mdb (``foreign``), ActiveMQ's Java JMS client as a peer (``java``), and the
ledger of who processed what (``ledger``)."""
