"""One SUBSCRIBE and what it holds: the seam's ``Subscription`` (``subscription``), its
deliveries between the wire and ``receive`` (``prefetched``), those not yet settled
(``unsettled``)."""
