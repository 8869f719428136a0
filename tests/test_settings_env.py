"""Label settings (TANDEM_KUBERAY_NAMESPACE_LABELS, TANDEM_PROMETHEUS_NAMESPACE_LABELS) as written in the environment."""
import pytest
from django.core.exceptions import ImproperlyConfigured

from controlplane.settings.env import env_labels


def test_labels_are_read_as_a_selectors_equality_terms(monkeypatch):
    monkeypatch.setenv("TANDEM_TEST_LABELS", "kubernetes.io/metadata.name=monitoring, team=obs")
    assert env_labels("TANDEM_TEST_LABELS") == {"kubernetes.io/metadata.name": "monitoring", "team": "obs"}
    monkeypatch.delenv("TANDEM_TEST_LABELS")
    assert env_labels("TANDEM_TEST_LABELS") == {}
    assert env_labels("TANDEM_TEST_LABELS", "a=b") == {"a": "b"}


@pytest.mark.parametrize("value", ["monitoring", "=monitoring", "a=b,monitoring"])
def test_a_value_that_is_not_labels_stops_the_start_saying_how_to_write_it(monkeypatch, value):
    monkeypatch.setenv("TANDEM_TEST_LABELS", value)
    with pytest.raises(ImproperlyConfigured, match="TANDEM_TEST_LABELS must be labels written key=value,key2=value2"):
        env_labels("TANDEM_TEST_LABELS")
