"""The portal's views: thin; reads through deployments.selectors, writes through deployments.services."""
