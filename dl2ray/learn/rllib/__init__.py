"""RLlib as a learner of DL2's environments: training (:mod:`.train`), our networks as RLlib modules
(:mod:`.module`, :mod:`.shape_module`) and the numpy export ``compare`` runs as ``rllib:DIR``
(:mod:`.export`)."""
