"""``kvserve chaos``: load on a cluster while its parts are killed and restarted (``run``),
the load (``load``), the verdicts against a reference (``verify``) and the table (``report``)."""
