"""One declaration per parameter, checked by JSON Schema: what values a notebook's (or a sweep
function's) parameters take.

A line of a notebook's parameter cell declares one parameter:

    lr: float = 0.1  # step size {exclusiveMinimum: 0}
    lrs: list[float] = [0.03, 0.1, 0.3]  # a rank correlation is taken over these {items: {exclusiveMinimum: 0}, minItems: 3, uniqueItems: true}
    mu: str = "sample"  # how mu is computed {enum: [sample, quadrature]}
    step: "Optional[float]" = None  # None: 1 / lr {exclusiveMinimum: 0}
    # {memory_bytes: "8 * n * d * len(seeds)"}

The annotation is the type (int, float, str, bool, list[X], dict[str, X], dict, "Optional[X]"), the
value the default, the comment the meaning, and the YAML mapping that may end the comment adds JSON
Schema keywords (draft 2020-12: minimum, maximum, exclusiveMinimum, exclusiveMaximum, enum,
minItems, maxItems, uniqueItems, items, properties, additionalProperties, propertyNames, format,
$ref to the shared `$defs` of `RULES_FILE`). The formats `file` and `folder` make a non-empty string
name an existing, readable one (made absolute: the kernel runs in the notebook's folder); `network`
is free text naming a network of `lowrank.core.nets.zoo`. `jsonschema` checks values against a
parameter's schema (`ParameterSpec.check`), after typing them by the
declared type (a whole float is an int where an int is declared, an int a float where a number is).
Beside what a declaration states: numbers are finite, integers fit in int64, seeds (`seed`,
`seeds`, `*_seed`) lie in 0..2^32-1, a non-empty list default needs a non-empty list, a dict takes
the keys of its default unless it declares its own (keys left out keep the default's values), and
every default obeys its own declaration. A comment line `{memory_bytes: EXPR}` states the notebook's
memory estimate in bytes, checked against `memory_limit()`; one `{within: {A: B}}` makes list A's
elements lie in list B's (what JSON Schema cannot say of two parameters); `RULES_FILE` (params/rules.yaml) holds
the estimates a cell does not state, and the shared definitions.

YAML (`-p` values of a type other than str, --params files, sweep specs) is read as YAML 1.2's core
schema reads it (`parse_yaml`: `1e-3` is 0.001, `010` is 10, `1:30`, `0b101`, `yes` and `2026-01-01`
are text), with one merge key per mapping and a bounded expansion of aliases; a `-p` value of a str
parameter is the text as given. The run key (`run_hash`) covers the contents of the files the
`file`/`folder` parameters name (`input_digests`).
"""

from __future__ import annotations

import ast
import difflib
import functools
import io
import json
import math
import os
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from lowrank.book import notebooks
from lowrank.core.io import parse_once
from lowrank.core.validation import SEED_MAX, cut, short

__all__ = ["ParameterSpec", "ParameterError", "parameter_specs", "declare", "resolve_parameters",
           "notebook_rules", "shared_definitions", "memory_estimate", "memory_limit", "check_memory", "parse_yaml",
           "parse_value", "load_yaml_mapping", "is_seed", "type_schema", "RULES_FILE"]


class ParameterError(notebooks.InputError):
    """A parameter a user gave is unknown or not allowed; raised before anything runs."""


INT_MAX = 2**63 - 1  # torch's int64
# the estimates of the notebooks whose cells do not state one, and the shared `$defs` (params/rules.yaml)
RULES_FILE = notebooks.SOURCE_ROOT / "params" / "rules.yaml"
NETWORK_NAME = re.compile(r"(?:MLP|MLP-BN|RES|RES-BN)-[1-9][0-9]{0,3}-[1-9][0-9]{0,5}|ResNet-18|VGG-16|ViT")
FORMATS = {"network": "a network of lowrank.core.nets.zoo: MLP-L-H, MLP-BN-L-H, RES-L-H, RES-BN-L-H (L, H positive), "
                      "ResNet-18, VGG-16 or ViT",
           "file": "an existing file or empty", "folder": "an existing folder or empty"}
# the Python types of an annotation and their JSON Schema types
JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object",
              type(None): "null"}
TYPE_NAMES = {"integer": "int", "number": "float", "string": "str", "boolean": "bool", "array": "list",
              "object": "mapping", "null": "None"}


def is_seed(name: str) -> bool:
    """`seed`, `seeds`, `*_seed`, `*_seeds`: integers in 0..2^32-1 whatever the declaration says."""
    return name in ("seed", "seeds") or name.endswith(("_seed", "_seeds"))


@functools.lru_cache(maxsize=1)
def _validator_class():
    """Draft 2020-12 with finite numbers, int64 integers (bools are neither) and the formats of
    `FORMATS` (built on first use: `lowrank --help` imports no jsonschema)."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine_many({
        "number": lambda _, x: isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x),
        "integer": lambda _, x: isinstance(x, int) and not isinstance(x, bool) and -INT_MAX - 1 <= x <= INT_MAX})
    return jsonschema.validators.extend(base, type_checker=checker)


@functools.lru_cache(maxsize=1)
def _format_checker():
    import jsonschema

    formats = jsonschema.FormatChecker([])

    @formats.checks("network")
    def _network(x):
        return not isinstance(x, str) or bool(NETWORK_NAME.fullmatch(x))

    def readable(x, kind: str) -> bool:
        if not isinstance(x, str) or not x:
            return True
        try:
            path = Path(x).expanduser()
        except RuntimeError:  # ~user of no user
            return False
        return (path.is_file() if kind == "file" else path.is_dir()) and os.access(path, os.R_OK)

    formats.checks("file")(lambda x: readable(x, "file"))
    formats.checks("folder")(lambda x: readable(x, "folder"))

    return formats


def _annotation_schema(node, where: str) -> dict:
    """The JSON Schema of an annotation's AST: int, float, str, bool, list[X], dict, dict[str, X],
    Optional[X], or the same as a string ("Optional[float]": papermill reads no `X | None`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _annotation_schema(ast.parse(node.value, mode="eval").body, where)
    if isinstance(node, ast.Name) and node.id in ("int", "float", "str", "bool", "list", "dict"):
        return {"type": JSON_TYPES[{"int": int, "float": float, "str": str, "bool": bool, "list": list,
                                    "dict": dict}[node.id]]}
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        inner = node.slice
        if node.value.id == "list":
            return {"type": "array", "items": _annotation_schema(inner, where)}
        if node.value.id == "dict" and isinstance(inner, ast.Tuple) and len(inner.elts) == 2:
            return {"type": "object", "additionalProperties": _annotation_schema(inner.elts[1], where)}
        if node.value.id == "Optional":
            schema = _annotation_schema(inner, where)
            return {**schema, "type": [schema["type"], "null"]}
    raise ValueError(f"{where}: the annotation {ast.unparse(node)!r} is not one of int, float, str, bool, list[X], "
                     f"dict, dict[str, X], 'Optional[X]'")


def type_schema(kind) -> dict | None:
    """The JSON Schema of a Python type (a sweep function's annotation), None where it says nothing."""
    import typing

    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind in JSON_TYPES and kind is not type(None):
        return {"type": JSON_TYPES[kind]}
    if origin in (list, tuple) and args:
        inner = type_schema(args[0])
        return {"type": "array", **({"items": inner} if inner else {})}
    if origin is typing.Union and len(args) == 2 and type(None) in args:
        inner = type_schema(next(a for a in args if a is not type(None)))
        return {**inner, "type": [inner["type"], "null"]} if inner and isinstance(inner["type"], str) else None
    return None


def _default_schema(default) -> dict | None:
    """The JSON Schema of a default without an annotation (a sweep function's argument)."""
    if isinstance(default, (bool, int, float, str)):
        return {"type": JSON_TYPES[type(default)]}
    if isinstance(default, list):
        kinds = {type(x) for x in default}
        if kinds and kinds <= {int, float}:
            return {"type": "array", "items": {"type": "number" if float in kinds else "integer"}}
        if len(kinds) == 1 and kinds <= {bool, str}:
            return {"type": "array", "items": {"type": JSON_TYPES[kinds.pop()]}}
        return {"type": "array"}
    return None


def _types(schema: dict) -> list:
    t = schema.get("type", [])
    return [t] if isinstance(t, str) else list(t)


def _merge(base: dict, stated: dict) -> dict:
    """A type's schema with the keywords a declaration states (`items` and `additionalProperties`
    keywords added to those of the type)."""
    out = dict(base)
    for key, value in stated.items():
        if key in ("items", "additionalProperties") and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def _implicit(name: str, schema: dict, default) -> dict:
    """The rules every declaration has beside what it states (the module docstring's list)."""
    schema = dict(schema)
    if is_seed(name):
        target = schema["items"] if "array" in _types(schema) and isinstance(schema.get("items"), dict) else schema
        target["minimum"] = max(target.get("minimum", 0), 0)
        target["maximum"] = min(target.get("maximum", SEED_MAX), SEED_MAX)
    if isinstance(default, list) and default and "minItems" not in schema:
        schema["minItems"] = 1
    if isinstance(default, dict) and not {"properties", "propertyNames", "$ref"} & set(schema):
        schema["propertyNames"] = {"enum": sorted(default)}
    return schema


@dataclass
class ParameterSpec:
    """One parameter: its default, its meaning (`comment`) and its JSON Schema (`schema`, with the
    shared `$defs` it refers to in `definitions`)."""

    name: str
    default: object
    comment: str = ""
    schema: dict = field(default_factory=dict)
    definitions: dict = field(default_factory=dict)

    def _resolved(self, schema: dict) -> dict:
        """`schema` with a local `$ref` ("#/$defs/NAME") replaced by its definition."""
        ref = schema.get("$ref")
        if ref is None:
            return schema
        key = ref.removeprefix("#/$defs/")
        if key not in self.definitions:
            raise ValueError(f"parameter {self.name!r}: $ref {ref!r} names no shared definition "
                             f"(there are {sorted(self.definitions)})")
        return {**self._resolved(self.definitions[key]), **{k: v for k, v in schema.items() if k != "$ref"}}

    @property
    def path(self) -> str | None:
        """"file" or "folder" where the parameter names one the notebook reads, else None."""
        fmt = self._resolved(self.schema).get("format")
        return fmt if fmt in ("file", "folder") else None

    def typed(self, value, schema: dict | None = None):
        """`value` typed by the declared type: NumPy scalars and tuples as Python's, a whole float
        as an int where an int is declared (1e3), an int as a float where a number is."""
        schema = self._resolved(self.schema if schema is None else schema)
        if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
            value = value.item()
        if isinstance(value, tuple) or type(value).__name__ == "ndarray":
            value = list(value)
        types = _types(schema)
        if isinstance(value, bool):
            return value
        if "integer" in types and isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
            return int(value)
        if "number" in types and "integer" not in types and isinstance(value, int):
            return float(value)
        if isinstance(value, list) and isinstance(schema.get("items"), dict):
            return [self.typed(x, schema["items"]) for x in value]
        if isinstance(value, dict):
            props, extra = schema.get("properties", {}), schema.get("additionalProperties")
            return {k: self.typed(x, props[k]) if k in props else self.typed(x, extra) if isinstance(extra, dict) else x
                    for k, x in value.items()}
        return value

    def from_text(self, text: str):
        """A `-p NAME VALUE` value: the text itself for a str parameter (`-p data_root no` is "no"),
        else read as YAML 1.2 (`parse_value`: 1e-3, [tanh, elu], {a: 1}, true)."""
        if _types(self._resolved(self.schema)) == ["string"]:
            return text
        return parse_value(text)

    def describe(self) -> str:
        """What the parameter allows, in words (`lowrank list`, the book's rerun box)."""
        return _describe(self._resolved(self.schema), self._resolved)

    def check(self, value):
        """`value` typed (`typed`) and checked against the schema; a `file`/`folder` made absolute, a
        dict completed by the default's entries. ParameterError saying what is allowed otherwise."""
        value = self.typed(value)
        errors = list(_validator_class()({**self.schema, "$defs": self.definitions},
                                         format_checker=_format_checker()).iter_errors(value))
        if errors:
            raise ParameterError(self._message(min(errors, key=_priority)))
        if isinstance(self.default, dict) and isinstance(value, dict):
            value = {**self.default, **value}
        if self.path is not None and value:
            value = str(Path(value).expanduser().absolute())  # the kernel runs in the notebook's folder
        return value

    def _message(self, error) -> str:
        """One line from jsonschema's error: the parameter (`name.key` inside a mapping), the value
        and what is wrong, then what the parameter allows."""
        keys = [str(p) for p in error.absolute_path if isinstance(p, str)]
        element = "element " if error.absolute_path and not isinstance(error.absolute_path[-1], str) else ""
        x, rule, kind = error.instance, error.schema.get(error.validator) if isinstance(error.schema, dict) else None, \
            error.validator
        shown = short(x)
        if kind == "type":
            wanted = [t for t in ([rule] if isinstance(rule, str) else rule) if t != "null"]
            if isinstance(x, int) and not isinstance(x, bool) and "integer" in wanted and not -INT_MAX - 1 <= x <= INT_MAX:
                why = "does not fit in a 64-bit integer"
            elif isinstance(x, float) and not math.isfinite(x) and {"number", "integer"} & set(wanted):
                why = "is not a finite number"
            else:
                why = {"integer": "is not an int", "number": "is not a number", "string": "is not a string",
                       "boolean": "is not a bool", "array": "is not a list", "object": "is not a mapping"}[wanted[0]]
        elif kind == "minItems":
            why = "is not a non-empty list" if rule == 1 else f"has {len(x)} elements"
            why += f"; at least {rule} needed"
        elif kind == "additionalProperties" or "propertyNames" in error.schema_path:
            bad = x if kind != "additionalProperties" else next(k for k in x if k not in error.schema.get("properties", {}))
            return self._line(keys, "", f"key {short(bad)} is not allowed")
        elif kind == "format":
            why = f"is not {FORMATS[rule].split(':')[0].removesuffix(' or empty')}"
        elif kind == "maxItems":
            why = f"has {len(x)} elements; at most {rule} allowed"
        else:
            why = {"minimum": "is below the minimum", "maximum": "is above the maximum",
                   "exclusiveMinimum": f"is not above {rule}", "exclusiveMaximum": f"is not below {rule}",
                   "enum": "is not allowed", "uniqueItems": "repeats a value (a grid that cannot show a trend)",
                   }.get(kind, error.message)
        return self._line(keys, element, f"{shown} {why}")

    def _line(self, keys, element: str, what: str) -> str:
        name = ".".join([self.name, *keys])
        return f"parameter {name!r}: {element}{what}; allowed: {cut(self.describe())}"


def _priority(error) -> tuple:
    """Which of several errors to report: a wrong type (or a non-finite number) first, then the
    declared rules, an int64 overflow last (a seed of 2^64 is above the seeds' maximum)."""
    x = error.instance
    overflow = error.validator == "type" and isinstance(x, int) and not isinstance(x, bool) and not \
        -INT_MAX - 1 <= x <= INT_MAX
    return (2 if overflow else 0 if error.validator == "type" else 1, list(map(str, error.absolute_path)))


def _describe(schema: dict, resolve) -> str:
    types = [t for t in _types(schema) if t != "null"]
    kind = TYPE_NAMES.get(types[0], types[0]) if types else "any value"
    items = resolve(schema["items"]) if isinstance(schema.get("items"), dict) else {}
    if types == ["array"] and _types(items):
        kind = f"list of {TYPE_NAMES[_types(items)[0]]}"
    if types == ["object"]:
        props = schema.get("properties") or {}
        names = sorted(props) or schema.get("propertyNames", {}).get("enum")
        kind = f"mapping with keys from {names}" if names else "mapping"
    if "null" in _types(schema):
        kind = f"None or {kind}"
    parts = [kind]
    for where, s in ((" ", schema), (" elements ", items),
                     (" values ", schema.get("additionalProperties") if isinstance(schema.get("additionalProperties"), dict) else {})):
        for key, text in (("format", "{}"), ("enum", "one of {}"), ("minimum", ">= {}"),
                          ("exclusiveMinimum", "> {}"), ("maximum", "<= {}"), ("exclusiveMaximum", "< {}")):
            if key in s:
                shown = FORMATS.get(s[key], s[key]) if key == "format" else s[key]
                prefix = "elements from" if where == " elements " and key == "enum" else ""
                parts.append(f"{prefix} {shown}".strip() if prefix else text.format(shown))
    for key, text in (("minItems", "at least {} element(s)"), ("maxItems", "at most {} element(s)"),
                      ("uniqueItems", "no repeated values")):
        if schema.get(key) not in (None, False):
            parts.append(text.format(schema[key]))
    return ", ".join(parts)


def _comments(source: str) -> dict[int, str]:
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string[1:].strip()
    return out


def _keywords(comment: str, where: str) -> tuple[dict, str]:
    """The YAML mapping `{...}` that ends a comment (the declaration's JSON Schema keywords), and the
    comment without it (the meaning)."""
    if not (comment.endswith("}") and "{" in comment):
        return {}, comment
    start = _mapping_start(comment)
    text = comment[start:]
    try:
        keywords = parse_yaml(text) or {}
    except ValueError as err:
        raise ValueError(f"{where}: unreadable keywords {text!r}: {err}") from None
    if not isinstance(keywords, dict):
        raise ValueError(f"{where}: keywords {text!r} are not a mapping")
    return keywords, comment[:start].strip()


def _mapping_start(comment: str) -> int:
    """Where the flow mapping that ends `comment` starts (its braces may nest: {items: {enum: [a]}})."""
    depth = 0
    for i in range(len(comment) - 1, -1, -1):
        depth += {"}": 1, "{": -1}.get(comment[i], 0)
        if depth == 0:
            return i
    return comment.rindex("{")


def _parameter_cell(name: str) -> str:
    nb = notebooks.read_notebook(name)
    cells = [c for c in nb.cells if c.cell_type == "code" and "parameters" in c.metadata.get("tags", [])]
    if len(cells) != 1:
        raise ValueError(f"{name}: a notebook needs exactly one cell tagged 'parameters', found {len(cells)}")
    return cells[0].source


def notebook_rules(name: str, path: Path | None = None) -> dict:
    """What `RULES_FILE` (params/rules.yaml) says of notebook `name`: `{"memory_bytes": EXPR}` (or
    nothing): the estimates the parameter cells do not state."""
    path = RULES_FILE if path is None else Path(path)
    if not path.is_file():
        return {}
    entry = load_yaml_mapping(path, "rules file", ValueError).get(name) or {}
    if not isinstance(entry, dict) or set(entry) - {"memory_bytes"}:
        raise ValueError(f"{path}: the entry of {name} must be a mapping with memory_bytes only (a parameter's rules "
                         f"are its declaration in the parameter cell)")
    return entry


def shared_definitions(path: Path | None = None) -> dict:
    """The `$defs` of `RULES_FILE`: JSON Schemas several declarations refer to (`$ref: "#/$defs/NAME"`)."""
    path = RULES_FILE if path is None else Path(path)
    defs = load_yaml_mapping(path, "rules file", ValueError).get("$defs", {}) if path.is_file() else {}
    if not isinstance(defs, dict):
        raise ValueError(f"{path}: $defs must be a mapping of names to JSON Schemas")
    return defs


@functools.lru_cache(maxsize=4096)
def _check_schema(text: str) -> None:
    """jsonschema's meta-schema check of a declaration (JSON text), once per distinct declaration."""
    _validator_class().check_schema(json.loads(text))


def declare(name: str, default, *, schema: dict | None = None, keywords: dict | None = None, comment: str = "",
            definitions: dict | None = None, where: str = "", check_default: bool = True) -> ParameterSpec:
    """A ParameterSpec from a type's schema (None: from the default), the declared JSON Schema
    keywords and the implicit rules; the schema itself is checked by jsonschema's meta-schema, and the
    default against it (`check_default`: a function's required argument has none)."""
    import jsonschema

    where = where or f"parameter {name}"
    base = schema if schema is not None else _default_schema(default) or {}
    full = _implicit(name, _merge(base, keywords or {}), default)
    try:
        _check_schema(json.dumps(full, sort_keys=True))
    except jsonschema.SchemaError as err:
        raise ValueError(f"{where}: the declaration is not a JSON Schema: {cut(err.message)}") from None
    spec = ParameterSpec(name, default, comment, full, dict(definitions or {}))
    try:
        if check_default:
            spec.check(default)
    except ParameterError as err:
        raise ValueError(f"{where}: the default breaks its own declaration: {err}") from None
    return spec


def parameter_specs(name: str) -> dict[str, ParameterSpec]:
    """The notebook's parameters, each from its declaration in the parameter cell (module docstring)."""
    source = _parameter_cell(name)
    defaults = notebooks.parameter_defaults_from_source(source)
    comments = _comments(source)
    definitions = shared_definitions()
    specs = {}
    for node in ast.parse(source).body:
        pname = node.target.id if isinstance(node, ast.AnnAssign) else node.targets[0].id
        where = f"{name}: parameter {pname}"
        if not isinstance(node, ast.AnnAssign):
            raise ValueError(f"{where} has no type annotation (`{pname}: TYPE = ...`): papermill and `-p` type by it")
        keywords, comment = _keywords(comments.get(node.end_lineno, ""), where)
        specs[pname] = declare(pname, defaults[pname], schema=_annotation_schema(node.annotation, where),
                               keywords=keywords, comment=comment, definitions=definitions, where=f"{name}: {pname}")
    return specs


def memory_estimate(name: str) -> str | None:
    """The notebook's memory estimate: a comment line `# {memory_bytes: "EXPR"}` in its parameter
    cell, else its `memory_bytes` in `RULES_FILE`; EXPR an arithmetic expression of the parameters
    (bytes; `len`, `max`, `min`, `sum`, `prod` allowed). None if neither states one."""
    source = _parameter_cell(name)
    found = None
    for lineno, comment in _comments(source).items():
        rules, _ = _keywords(comment, f"{name}: parameter cell line {lineno}")
        if "memory_bytes" in rules:
            found = str(rules["memory_bytes"])
    if found is None and notebook_rules(name).get("memory_bytes") is not None:
        found = str(notebook_rules(name)["memory_bytes"])
    return found


# the sizes a memory estimate may use beside the parameters' own values (rough upper bounds: an
# estimate is there to refuse a run that cannot fit, before a kernel starts, not to budget one)
DATASET_SHAPES = {"digits": (1797, 64), "mnist1d": (5000, 40), "mnist": (70000, 784), "cifar10": (60000, 3072)}
LARGEST_INPUT = 3072  # CIFAR-10's 3 x 32 x 32: the widest input of any data set


def _names(value) -> list:
    """A name or a (nested) list of names, as a flat list."""
    if isinstance(value, list):
        return [n for v in value for n in _names(v)]
    return [value]


def dataset_bytes(name) -> float:
    """float32 bytes of a data set (train and test); the largest one for a list of names."""
    return 4.0 * max(math.prod(DATASET_SHAPES.get(n, DATASET_SHAPES["cifar10"])) for n in _names(name))


def dataset_width(name) -> float:
    """Input features of a data set; the widest of a list of names."""
    return float(max(DATASET_SHAPES.get(n, DATASET_SHAPES["cifar10"])[1] for n in _names(name)))


def network_parameters(model, cnn_width=1.0, vit_dim=512, vit_depth=6) -> float:
    """Parameters of a network of `lowrank.core.nets.zoo` by name (the largest of a list), for the
    widest input (`LARGEST_INPUT`): MLP-L-H about L H^2 + 3072 H, ResNet-18 11.2e6 and VGG-16 15e6
    times cnn_width^2, ViT 12 depth dim^2."""
    out = 0.0
    for m in _names(model):
        if m == "ResNet-18":
            n = 11.2e6 * cnn_width ** 2
        elif m == "VGG-16":
            n = 15e6 * cnn_width ** 2
        elif m == "ViT":
            n = 12.0 * vit_depth * vit_dim ** 2
        else:
            depth, width = (float(x) for x in str(m).rsplit("-", 2)[-2:])
            n = depth * width ** 2 + (LARGEST_INPUT + 10) * width
        out = max(out, n)
    return out


def network_activations(model, batch, cnn_width=1.0, vit_dim=512, vit_depth=6) -> float:
    """Floats a network keeps for its backward pass on `batch` samples of the widest input: MLP-L-H
    4 L H per sample, ResNet-18 2.5e6 and VGG-16 1.5e6 times cnn_width, ViT 16 depth 65 dim."""
    out = 0.0
    for m in _names(model):
        if m == "ResNet-18":
            n = 2.5e6 * cnn_width
        elif m == "VGG-16":
            n = 1.5e6 * cnn_width
        elif m == "ViT":
            n = 16.0 * vit_depth * 65 * vit_dim
        else:
            depth, width = (float(x) for x in str(m).rsplit("-", 2)[-2:])
            n = 4 * depth * width + LARGEST_INPUT
        out = max(out, n * batch)
    return out


SIZE_KEYS = ("widths", "channels", "hidden", "kernel_size")  # a network's keyword arguments that size it


def numbers_in(value) -> float:
    """The sum of the sizes in a parameter value: of a dict of a network's keyword arguments the
    values under `SIZE_KEYS` only (a seed or an initial scale sizes nothing, and `seed: -20000` must
    not cancel `widths: [20000]`), of a list its numbers. A negative size is refused."""
    if isinstance(value, dict):
        return sum(numbers_in(v) for k, v in value.items() if k in SIZE_KEYS)
    if isinstance(value, list):
        return sum(numbers_in(v) for v in value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not value >= 0:
            raise ParameterError(f"a network size of {value!r} is given; sizes (widths, channels, ...) are >= 0")
        return float(value)
    return 0.0


_SAFE_CALLS = {"len": len, "max": max, "min": min, "sum": sum, "prod": math.prod, "dataset_bytes": dataset_bytes,
               "dataset_width": dataset_width, "network_parameters": network_parameters,
               "network_activations": network_activations, "numbers_in": numbers_in}


def _evaluate(expr: str, names: dict) -> float:
    """An arithmetic expression of parameter values, without eval's reach."""
    ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Pow: lambda a, b: a ** b}

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.Name) and node.id in names:
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _SAFE_CALLS:
            return _SAFE_CALLS[node.func.id](*[ev(a) for a in node.args])
        if isinstance(node, ast.List):
            return [ev(e) for e in node.elts]
        if isinstance(node, ast.Subscript):  # a dict parameter's value: arch_kwargs["widths"]
            return ev(node.value)[ev(node.slice)]
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        raise ValueError(f"memory estimate {expr!r}: {ast.dump(node)[:60]} is not allowed")

    return float(ev(ast.parse(expr, mode="eval")))


_MEMORY = re.compile(r"([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)\s*([KMGT]?)(?:i?B)?", re.IGNORECASE)


def physical_memory() -> int:
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def memory_limit() -> int:
    """Bytes a run may ask for: $LOWRANK_MEMORY_LIMIT (a positive number of bytes, optionally with
    a K/M/G/T suffix: 8G, 512MiB, 1e9), else 80 % of this machine's physical memory. Anything else
    (text, zero, a negative or non-finite number) is refused with one line."""
    text = os.environ.get("LOWRANK_MEMORY_LIMIT")
    if text is None or not text.strip():
        return int(0.8 * physical_memory())
    m = _MEMORY.fullmatch(text.strip())
    value = float(m[1]) * 1024 ** " KMGT".index((m[2] or " ").upper()) if m else math.nan
    if not (math.isfinite(value) and value >= 1):
        raise ParameterError(f"LOWRANK_MEMORY_LIMIT={short(text)} is not a positive number of bytes "
                             f"(e.g. 8G, 512M or 1e9)")
    return int(value)


def check_memory(name: str, params: dict) -> None:
    """Refuse parameters whose memory estimate (the notebook's `memory_bytes`) exceeds `memory_limit`."""
    limit = memory_limit()  # validated whether or not the notebook states an estimate
    expr = memory_estimate(name)
    if expr is None:
        return
    try:
        need = _evaluate(expr, params)
    except (OverflowError, ValueError, TypeError, KeyError, IndexError, ZeroDivisionError) as err:
        raise ParameterError(f"{name}: the memory estimate ({expr}) cannot be evaluated for these parameters "
                             f"({type(err).__name__}: {short(str(err))})") from None
    if need > limit:
        raise ParameterError(f"{name}: these parameters need about {need / 2**30:.3g} GiB by the notebook's estimate "
                             f"({expr}), more than the {limit / 2**30:.3g} GiB allowed here "
                             f"(set LOWRANK_MEMORY_LIMIT to change it)")


# YAML as the parameters are read everywhere (`-p` values, --params files, sweep specs, declaration
# keywords): the safe loader with YAML 1.2's core schema (https://yaml.org/spec/1.2.2/#103-core-schema)
# in place of PyYAML's YAML 1.1 resolvers: 1e-3 is a float, 010 is 10, and 1:30, 0b101, yes/no and
# dates are text; merge keys (`<<: *base`), one per mapping; no repeated key; and a bounded size once
# aliases are expanded (an "alias bomb" of a few hundred bytes stands for billions of values: refused
# before anything walks it).
YAML_MAX_VALUES = 100_000  # values (scalars, list elements, mapping entries) after alias expansion
YAML_MAX_DEPTH = 50
YAML_MAX_BYTES = 1 << 20
CORE_SCHEMA = [  # (tag, regular expression, first characters) of YAML 1.2's core schema, and the merge key
    ("null", r"~|null|Null|NULL|", ["~", "n", "N", ""]),
    ("bool", r"true|True|TRUE|false|False|FALSE", list("tTfF")),
    ("int", r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+", list("-+0123456789")),
    ("float", r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)",
     list("-+.0123456789")),
    ("merge", r"<<", ["<"]),
]
_LOADER = None


def _loader():
    """The YAML loader class (built on first use: `import yaml` is not needed for `lowrank --help`)."""
    global _LOADER
    if _LOADER is not None:
        return _LOADER
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen, merges = set(), 0
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    merges += 1
                    if merges > 1:
                        raise yaml.constructor.ConstructorError(None, None, "more than one merge key '<<' (merge a list: "
                                                                "<<: [*a, *b])", key_node.start_mark)
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

        def construct_yaml_int(self, node):  # 1.2: 010 is ten, 0o10 eight (PyYAML's 1.1 reads 010 as eight)
            text = self.construct_scalar(node)
            return int(text[2:], 8) if text.startswith("0o") else int(text[2:], 16) if text.startswith("0x") else int(text)

    Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_yaml_int)
    Loader.yaml_implicit_resolvers = {}
    for tag, pattern, first in CORE_SCHEMA:
        Loader.add_implicit_resolver(f"tag:yaml.org,2002:{tag}", re.compile(f"^(?:{pattern})$"), first)
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


def _load(text: str):
    import yaml

    return yaml.load(text, Loader=_loader())


def parse_yaml(text: str, where: str = "YAML text"):
    """`text` read by the book's YAML loader (`_loader`), bounded (`_check_size`); ValueError with
    one line otherwise."""
    import yaml

    if len(text) > YAML_MAX_BYTES:
        raise ValueError(f"{where} is larger than {YAML_MAX_BYTES} bytes")
    try:
        data = parse_once(_load, text)
    except yaml.YAMLError as err:
        raise ValueError(f"{where} is not valid YAML: {cut(' '.join(str(err).split()))}") from None
    except RecursionError:
        raise ValueError(f"{where} nests too deeply") from None
    _check_size(data, where)
    return data


def parse_value(text: str):
    """A `-p NAME VALUE` value: a YAML scalar or flow collection (0.3, 1e-3, relu, [tanh, elu],
    true), read as `parse_yaml` reads files; text that is not YAML stays text."""
    try:
        return parse_yaml(text, "the value")
    except ValueError as err:
        if "expands to more" in str(err) or "larger than" in str(err) or "nests too" in str(err):
            raise ParameterError(f"{str(err)}: {short(text)}") from None
        return text


def load_yaml_mapping(path, what: str = "parameter file", error=ParameterError) -> dict:
    """A YAML file holding a mapping with string keys: UTF-8, no repeated key, bounded (`parse_yaml`);
    `error` otherwise."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{what} {path} does not exist" + (" (it is a folder)" if path.is_dir() else ""))
    if path.stat().st_size > YAML_MAX_BYTES:
        raise error(f"{what} {path} is larger than {YAML_MAX_BYTES} bytes")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise error(f"{what} {path} is not UTF-8 text (byte {err.object[err.start]:#x} at offset {err.start})") from None
    except OSError as err:
        raise error(f"{what} {path} cannot be read ({err.strerror})") from None
    try:
        data = parse_yaml(text, f"{what} {path}")
    except ValueError as err:
        raise error(str(err)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise error(f"{what} {path} must hold a mapping name: value, got {type(data).__name__}")
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise error(f"{what} {path}: keys must be names (strings), got {short(bad[0])} ({type(bad[0]).__name__})")
    return data


def _check_within(name: str, resolved: dict) -> None:
    """A comment line `{within: {PARAMETER: OTHER}}` of the parameter cell: PARAMETER's elements must be
    among OTHER's (a noise data set the run does not load would be dropped without a word)."""
    for lineno, comment in _comments(_parameter_cell(name)).items():
        keywords, _ = _keywords(comment, f"{name}: parameter cell line {lineno}")
        for pname, other in (keywords.get("within") or {}).items():
            left_out = [x for x in resolved[pname] if x not in resolved[other]]
            if left_out:
                raise ParameterError(f"parameter {pname!r}: {short(left_out)} not in {other} {short(resolved[other])}; "
                                     f"give -p {pname} with elements of {other}")


def resolve_parameters(name: str, *, scale: str = "ci", params_file=None, overrides: dict | None = None,
                       texts: dict | None = None, memory: bool = True) -> dict:
    """The full parameter set of a run: defaults, then the scale's YAML (`params/laptop/` or
    `params/paper/`, scale="laptop" or "paper"), then a user's YAML, then `overrides`, then `texts`
    (`-p NAME VALUE`: typed by each parameter's declared type, `ParameterSpec.from_text`). Every given
    name and value is checked against its declaration, and (`memory`, for a run on this machine) the
    whole set against the notebook's memory estimate."""
    if scale not in notebooks.SCALES:
        raise ParameterError(f"scale must be one of {', '.join(notebooks.SCALES)}, got {scale!r}")
    specs = parameter_specs(name)
    given: dict = {}
    if scale != "ci":
        path = notebooks.scale_params_path(name, scale)
        if not path.is_file():
            raise ParameterError(f"{name} has no {scale}-scale parameter file {path}")
        given.update(load_yaml_mapping(path))
    user = load_yaml_mapping(params_file) if params_file is not None else {}
    bad = [k for k in [*(overrides or {}), *(texts or {})] if not isinstance(k, str)]
    if bad:
        raise ParameterError(f"parameter names must be strings, got {short(bad[0])}")
    user.update(overrides or {})
    user.update({k: specs[k].from_text(v) if k in specs else v for k, v in (texts or {}).items()})
    if "scale" in user:
        raise ParameterError("'scale' labels the starting point (ci defaults, the laptop or the paper YAML): set it with --scale")
    given.update(user)
    resolved = {k: s.default for k, s in specs.items()}
    for key, value in given.items():
        if key not in specs:
            close = difflib.get_close_matches(key, list(specs), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; parameters are {sorted(specs)}"
            raise ParameterError(f"{name} has no parameter {key!r}{hint}")
        resolved[key] = specs[key].check(value)
    _check_within(name, resolved)
    if memory:
        check_memory(name, resolved)
    return resolved
