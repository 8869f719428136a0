"""OpenAI-compatibility conformance: the suite (suite.py) and its run against a deployment (runner.py)."""
