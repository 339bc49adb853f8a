"""Gang mode, the non-preemptive, fixed-size sibling of the DL2 simulator that SCHED² and Harmony run in:
the simulator (:mod:`.sim`: ``GangSimulator``, gang packing, locality, pairwise interference, its metrics)
and its traces (:mod:`.trace`: Philly all-reduce windows and sized synthetic jobs)."""
