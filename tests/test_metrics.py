"""Run metrics: the censored average JCT used for model selection."""


def test_censored_avg_jct_counts_unfinished_jobs_until_the_run_stopped():
    from dl2ray.evaluation.metrics import censored_avg_jct
    from dl2ray.sim import RunResult

    r = RunResult.__new__(RunResult)
    r.arrival, r.end_time, r.rewards = {0: 0, 1: 2, 2: 4}, {0: 3.5}, [0.1] * 10
    # job 0 finished at 3.5; jobs 1 and 2 still running after 10 slots
    assert censored_avg_jct(r) == (3.5 + (10 - 2) + (10 - 4)) / 3
    r.arrival = {**r.arrival, 3: 25}  # arrives after the run stopped: never in the cluster, counts 0
    assert censored_avg_jct(r) == (3.5 + (10 - 2) + (10 - 4) + 0) / 4


def test_summary_counts_unfinished_jobs_and_reports_the_censored_average():
    from dl2ray.evaluation.metrics import summarize_run
    from dl2ray.sim import RunResult

    r = RunResult(1200.0, {0: 0, 1: 2, 2: 4}, {0: 3.5}, {0: 0, 1: 2}, [0.5] * 10, [0.5] * 10,
                  [0.1] * 10, 10)
    m = summarize_run(r)
    assert (m["jobs"], m["completed"], m["unfinished"]) == (3, 1, 2)
    assert m["avg_jct"] == 3.5  # finished jobs only
    assert m["censored_avg_jct"] == (3.5 + 8 + 6) / 3


def test_json_of_a_summary_never_contains_nan():
    import json
    import math

    from dl2ray.evaluation.report import dumps

    text = dumps({"a": math.nan, "b": [1.0, math.inf, {"c": -math.inf}], "d": "x", "e": 2})
    assert json.loads(text) == {"a": None, "b": [1.0, None, {"c": None}], "d": "x", "e": 2}
