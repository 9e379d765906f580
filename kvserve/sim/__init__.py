"""``kvserve sim``: a discrete-event simulator of a kvserve cluster and the analyses built on it.

The simulator runs the project's real policy code (the router's conductor, the ratio
controller, the workers' scheduler and block accounting) against modelled costs
(:mod:`kvserve.sim.costs`), so a P:D question can be asked at any scale in seconds.
"""

SIM_ENV = "KVSERVE_SIM_"
"""The prefix of the ``kvserve sim`` settings' variables."""
