"""How schedulers are judged: JCT and utilisation summaries (:mod:`.metrics`), the per-job lower bound
(:mod:`.references`), every scheduler over the same traces in a process pool (:mod:`.comparison`) and
its tables and plots (:mod:`.report`)."""
