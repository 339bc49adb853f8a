"""Studies that run many trainings or comparisons and write a report: the robustness sweeps
(:mod:`.robustness`, :mod:`.robustness_report`) and the paper's learning experiments (:mod:`.learning`)."""
