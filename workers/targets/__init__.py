"""Target drivers, one per cluster kind."""


def target_for(cluster):
    """The driver for a cluster's kind."""
    from workers.targets import eks, kubernetes, ray

    drivers = {"ray": ray.RayTarget, "kubernetes": kubernetes.KubernetesTarget, "eks": eks.EksTarget}
    return drivers[cluster.kind](cluster)
