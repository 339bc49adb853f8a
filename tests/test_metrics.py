"""Run metrics: the censored average JCT used for model selection."""


def test_censored_avg_jct_counts_unfinished_jobs_until_the_run_stopped():
    from dl2ray.metrics import censored_avg_jct
    from dl2ray.sim import RunResult

    r = RunResult.__new__(RunResult)
    r.arrival, r.end_time, r.rewards = {0: 0, 1: 2, 2: 4}, {0: 3.5}, [0.1] * 10
    # job 0 finished at 3.5; jobs 1 and 2 still running after 10 slots
    assert censored_avg_jct(r) == (3.5 + (10 - 2) + (10 - 4)) / 3
