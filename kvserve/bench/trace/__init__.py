"""``kvserve bench trace``: prefix hit rates of Mooncake-format traces without a model
(:mod:`kvserve.bench.trace.run.run`, the one entry): the traces of one run (:mod:`.traces`), live
replays through a real ``mooncake_master`` (:mod:`.pool`) and its SSD tier (:mod:`.ssd`), and
the plots (:mod:`.plot`). The simulation it drives is :mod:`kvserve.sim.trace`'s."""
