"""Harmony (Bao, Peng, Wu, INFOCOM'19): interference-aware placement in gang mode (:mod:`dl2ray.gang`)."""
