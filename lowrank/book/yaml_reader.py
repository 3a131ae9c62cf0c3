"""YAML text as the book reads it everywhere: `-p` values, --params files, sweep specs, rule comments,
and the options of a notebook's code cells.

The safe loader; numbers as papermill and YAML 1.2 read them (1e-3 and 1.0e3 are floats, where
YAML 1.1 reads them as text); merge keys (`<<: *base`); no repeated key; and a bounded size once
aliases are expanded (an "alias bomb" of a few hundred bytes stands for billions of values: refused
before anything walks it). `lowrank.book.rules` reads parameter files and values with it;
`lowrank.book.notebooks` reads code-cell options.
"""

from __future__ import annotations

import re

from lowrank.core.validation import cut, short

__all__ = ["YAML_MAX_VALUES", "YAML_MAX_DEPTH", "YAML_MAX_BYTES", "parse_yaml"]

YAML_MAX_VALUES = 100_000  # values (scalars, list elements, mapping entries) after alias expansion
YAML_MAX_DEPTH = 50
YAML_MAX_BYTES = 1 << 20
_EXPONENT_FLOAT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9][0-9_]*(?:\.[0-9_]*)?)[eE][-+]?[0-9]+$")
_LOADER = None


def _loader():
    """The YAML loader class (built on first use: `import yaml` is not needed for `lowrank --help`)."""
    global _LOADER
    if _LOADER is not None:
        return _LOADER
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    hash(key)
                except TypeError:
                    raise yaml.constructor.ConstructorError(None, None, f"a key must be a name, got a {type(key).__name__}",
                                                            key_node.start_mark) from None
                if key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"duplicate key {short(key)}", key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+.0123456789"))
    _LOADER = Loader
    return Loader


def _check_size(data, where: str) -> None:
    """Refuse `data` whose expanded size exceeds YAML_MAX_VALUES (or nests deeper than
    YAML_MAX_DEPTH: a recursive alias), stopping at the bound: time and memory stay bounded."""
    budget = [YAML_MAX_VALUES]

    def walk(x, depth):
        budget[0] -= 1
        if budget[0] < 0 or depth > YAML_MAX_DEPTH:
            raise ValueError(f"{where} expands to more than {YAML_MAX_VALUES} values or {YAML_MAX_DEPTH} levels "
                             f"(aliases that repeat each other?)")
        if isinstance(x, dict):
            for k, v in x.items():
                walk(k, depth + 1)
                walk(v, depth + 1)
        elif isinstance(x, list):
            for v in x:
                walk(v, depth + 1)

    walk(data, 0)


def parse_yaml(text: str, where: str = "YAML text"):
    """`text` read by the book's YAML loader (`_loader`), bounded (`_check_size`); ValueError with
    one line otherwise."""
    import yaml

    if len(text) > YAML_MAX_BYTES:
        raise ValueError(f"{where} is larger than {YAML_MAX_BYTES} bytes")
    try:
        data = yaml.load(text, Loader=_loader())
    except yaml.YAMLError as err:
        raise ValueError(f"{where} is not valid YAML: {cut(' '.join(str(err).split()))}") from None
    except RecursionError:
        raise ValueError(f"{where} nests too deeply") from None
    _check_size(data, where)
    return data
