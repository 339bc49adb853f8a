"""The parts of a job host (:class:`clusters.ray.job.JobHostImpl`), one job each; the host composes them.

* :mod:`~clusters.ray.host.members` — the job's member actors under the host's lock: reap, prefer nodes,
  close, the rows of a status;
* :mod:`~clusters.ray.host.coordinator` — the elastic MXNet coordinator's thread, its config and the one
  persistent client the status reads use;
* :mod:`~clusters.ray.host.slots` — the per-slot observations (history) and the slot mark;
* :mod:`~clusters.ray.host.saver` — the durable record written now or, for a slot's observation, soon;
* :mod:`~clusters.ray.host.pusher` — the thread that opens each slot of the agent's clock and writes the
  job's reading to the GCS.
"""
