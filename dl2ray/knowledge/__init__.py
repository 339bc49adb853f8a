"""What an operator knows, and so all a deployable scheduler may know: the operator's speed profile
(:mod:`.profile`: a few measured points per job type, fitted) and the config with the simulator's truth
hidden (:mod:`.hidden`: ``operator_config``, the fields that raise ``TruthAccessError``)."""
