"""Retention's settings (JOB_RETENTION_*): defaults, 0 = kept for ever, bad values named; and
its counters travel from a worker process to its supervisor's /metrics."""

from __future__ import annotations

import pytest
from conftest import config_of

from pipeline import ConfigError
from pipeline.admin.metrics import Metrics


def test_defaults_keep_completed_jobs_a_week_and_dead_ones_thirty_days() -> None:
    retention = config_of().retention
    assert (retention.completed_seconds, retention.dead_seconds, retention.interval_seconds) == (604_800, 2_592_000, 60)
    assert retention.kept_for() == {"completed": 604_800, "dead": 2_592_000, "cancelled": 604_800}


def test_zero_keeps_a_status_for_ever() -> None:
    assert config_of(job_retention_completed_seconds=0).retention.kept_for() == {"dead": 2_592_000, "cancelled": 604_800}
    assert config_of(job_retention_completed_seconds=0, job_retention_dead_seconds=0,
                     job_retention_cancelled_seconds=0).retention.kept_for() == {}


@pytest.mark.parametrize("name, value", [("JOB_RETENTION_COMPLETED_SECONDS", "-1"), ("JOB_RETENTION_DEAD_SECONDS", "a week"),
                                         ("JOB_RETENTION_INTERVAL_SECONDS", "0")])
def test_a_bad_value_is_refused_naming_its_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        config_of(**{name.lower(): value})


def test_pruned_counts_add_up_across_worker_processes() -> None:
    supervisor = Metrics(external=lambda: [Metrics(pruned={"completed": 3, "workers": 1}).snapshot(),
                                           Metrics(pruned={"completed": 2, "dead": 4}).snapshot()])
    text = supervisor.render({"by_status": {}, "by_type": {}})
    assert 'pipeline_jobs_pruned_total{status="completed"} 5' in text
    assert 'pipeline_jobs_pruned_total{status="dead"} 4' in text
    assert "pipeline_workers_pruned_total 1" in text
