"""What the operator's tools do to a whole queue (``Connection.browse``, ``take``,
``lock``): a subscription that browses it (``browser``), reading it back on a broker
without a browser (``read_through``), taking it to its end (``take``, ``end_marker``)
and holding its lock (``lock``)."""
