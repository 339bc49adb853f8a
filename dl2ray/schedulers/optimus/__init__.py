"""Optimus (Peng et al., EuroSys 2018) and its reference twin: the scheduler, its greedy marginal-gain
allocation (:mod:`.scheduler`: ``Optimus``, ``Greedy``), the online loss and speed fits it learns from
observations (:mod:`.fit`), and ``optimus-truth``, the same greedy on the simulator's true speed surfaces
(:mod:`.truth`; a reference, not deployable)."""
