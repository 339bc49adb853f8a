"""SCHED² (Luan et al.): locality-aware job selection by DQN in gang mode (:mod:`dl2ray.gang`)."""
