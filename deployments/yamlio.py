"""YAML through libyaml's C parser and emitter where PyYAML has them (several times faster than the pure Python
ones, and a reconcile pass parses a kubeconfig and dumps a serve config), the safe subset either way. The C emitter
writes the same text as the Python one for what Tandem dumps, so spec hashes do not change with it."""
import yaml

YAMLError = yaml.YAMLError
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def yaml_load(text: str):
    return yaml.load(text, Loader=_LOADER)


def yaml_dump(data, **kwargs) -> str:
    return yaml.dump(data, Dumper=_DUMPER, **kwargs)
