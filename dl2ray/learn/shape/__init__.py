"""The shape policy's learners: supervised warm start (:mod:`.sl`), the trainer of every shape
algorithm (:mod:`.trainer`), counterfactual per-job credit (:mod:`.counterfactual`), rollout search
(:mod:`.search`), on-policy per-job policy gradient (:mod:`.pg`), both in one update (:mod:`.mix`),
and the twin a learner computes that credit in (:mod:`.twin`)."""
