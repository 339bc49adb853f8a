"""Gymnasium environments over the simulator: the paper's incremental-action ``DL2Env``
(:mod:`.dl2_env`) and the shape policy's one-slot-per-step ``ShapeEnv`` (:mod:`.shape_env`)."""
