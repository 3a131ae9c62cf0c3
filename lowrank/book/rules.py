"""The parameter-rule language: what values a notebook's (or a sweep function's) parameters take.

Parameter specs come from the notebook's parameter cell: the type is the default's type, and a
comment may end with a YAML mapping stating the allowed values (`RULE_KEYS`), e.g.

    mu = "sample"  # how mu is computed {choices: [sample, quadrature]}
    n = 375  # samples {min: 2}
    lr = 0.1  # step size {gt: 0}
    momentum = 0.9  # {min: 0, lt: 1}
    lrs = [0.03, 0.1, 0.3]  # a rank correlation is taken over these {gt: 0, min_len: 3}
    milestones = []  # {type: int, min: 1}
    activations = ["tanh"]  # {items: [tanh, relu, elu]}
    # {memory_bytes: "8 * n * d * len(seeds)"}

`min`/`max` are inclusive, `gt`/`lt` strict; `path: file` (or `folder`) makes a non-empty string
name an existing file (made absolute: the kernel runs in the notebook's folder); a `type` is needed where the default does not show
the element type (an empty list, None); `kind: network` checks free text naming a network; a dict
parameter takes the keys of its default (or `keys`), each value checked like the default's.
Numbers must be finite, seeds (`seed`, `seeds`, `*_seed`) lie in 0..2^32-1, and a comment line
`{memory_bytes: EXPR}` states the notebook's memory estimate in bytes, checked against
`memory_limit()`. Rules and estimates a cell does not state live in `params/rules.yaml`
(`notebook_rules`). Every default must obey its own rules.

Values are YAML read as papermill reads numbers (`parse_yaml`: `1e-3` is 0.001), with merge keys
and a bounded expansion of aliases; error messages cut long values. The run key (`run_hash`)
covers the contents of the files the `path` parameters name (`input_digests`).
"""

from __future__ import annotations

import ast
import difflib
import io
import math
import os
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

from lowrank.book import notebooks
from lowrank.core.io import parse_once
from lowrank.core.validation import SEED_MAX, cut, short

__all__ = ["ParameterSpec", "ParameterError", "parameter_specs", "resolve_parameters", "notebook_rules",
           "memory_estimate", "memory_limit", "check_memory", "parse_yaml", "parse_value", "load_yaml_mapping",
           "is_seed", "RULE_KEYS", "RULES_FILE"]


class ParameterError(notebooks.InputError):
    """A parameter a user gave is unknown or not allowed; raised before anything runs."""


RULE_KEYS = ("choices", "items", "min", "max", "gt", "lt", "min_len", "max_len", "type", "path", "kind", "keys")
TYPES = {"int": int, "float": float, "str": str, "bool": bool}
INT_MAX = 2**63 - 1  # torch's int64
# rules and memory estimates of the notebooks kept beside them (params/rules.yaml), for what a
# parameter cell's comments do not say; see `notebook_rules`
RULES_FILE = notebooks.REPO_ROOT / "params" / "rules.yaml"
# `kind` rules: free text that names something of the package, checked without importing torch
NETWORK_NAME = re.compile(r"(?:MLP|MLP-BN|RES|RES-BN)-[1-9][0-9]{0,3}-[1-9][0-9]{0,5}|ResNet-18|VGG-16|ViT")
KINDS = {"network": (NETWORK_NAME, "a network of lowrank.core.nets.zoo: MLP-L-H, MLP-BN-L-H, RES-L-H, RES-BN-L-H "
                                   "(L, H positive), ResNet-18, VGG-16 or ViT")}


def is_seed(name: str) -> bool:
    """`seed`, `seeds`, `*_seed`, `*_seeds`: integers in 0..2^32-1 whatever the cell says."""
    return name in ("seed", "seeds") or name.endswith(("_seed", "_seeds"))


def _plain(x):
    """NumPy scalars as the Python numbers they are (a library caller's np.int64(3) is 3)."""
    module = type(x).__module__
    if module == "numpy" and hasattr(x, "item") and getattr(x, "ndim", 1) == 0:
        return x.item()
    return x


@dataclass
class ParameterSpec:
    """One parameter of a notebook's parameter cell and the rules its values obey.

    The value type is the default's (ints are accepted for floats); a list's element type is that
    of the default's elements, or `type` (needed when the default is an empty list or None). Rules
    on numbers (`min`, `max`: inclusive; `gt`, `lt`: strict) apply to every element of a list;
    `min_len`, `max_len` bound a list's length (a non-empty default needs at least one element).
    Numbers must be finite, integers fit in int64, seeds (see `is_seed`) lie in 0..2^32-1.
    """

    name: str
    default: object
    comment: str = ""
    choices: list | None = None
    items: list | None = None  # allowed elements of a list parameter
    min: float | None = None
    max: float | None = None
    gt: float | None = None
    lt: float | None = None
    min_len: int | None = None
    max_len: int | None = None
    type: str | None = None  # element type of a list (or value type of a None default)
    path: str | None = None  # "file" or "folder": a non-empty value must name an existing one
    kind: str | None = None  # free text naming something (`KINDS`), e.g. "network"
    keys: list | None = None  # allowed keys of a dict parameter (default: the default's keys)

    def __post_init__(self):
        where = f"parameter {self.name!r}"
        if self.kind is not None and self.kind not in KINDS:
            raise ValueError(f"{where}: rule kind must be one of {sorted(KINDS)}, got {self.kind!r}")
        if self.keys is not None and (not isinstance(self.keys, list) or not all(isinstance(k, str) for k in self.keys)):
            raise ValueError(f"{where}: rule keys must be a list of names")
        for key in ("min", "max", "gt", "lt"):
            v = getattr(self, key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
                raise ValueError(f"{where}: rule {key} must be a finite number, got {v!r}")
        for key in ("min_len", "max_len"):
            v = getattr(self, key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ValueError(f"{where}: rule {key} must be a non-negative integer, got {v!r}")
        if self.path not in (None, "file", "folder"):
            raise ValueError(f"{where}: rule path must be file or folder, got {self.path!r}")
        if self.path is not None and not isinstance(self.default, str):
            raise ValueError(f"{where}: rule path needs a string default")
        if self.type is not None and self.type not in TYPES:
            raise ValueError(f"{where}: rule type must be one of {sorted(TYPES)}, got {self.type!r}")
        for key in ("choices", "items"):
            if getattr(self, key) is not None and not isinstance(getattr(self, key), list):
                raise ValueError(f"{where}: rule {key} must be a list")
        if is_seed(self.name):
            self.min = 0 if self.min is None else max(self.min, 0)
            self.max = SEED_MAX if self.max is None else min(self.max, SEED_MAX)
        if self.min_len is None and isinstance(self.default, list) and self.default:
            self.min_len = 1

    def element_type(self):
        """The type every scalar (or list element) must have, or None if any scalar goes."""
        if self.type is not None:
            return TYPES[self.type]
        d = self.default
        if isinstance(d, list):
            kinds = {type(x) for x in d}
            if kinds and kinds <= {int, float}:
                return float if float in kinds else int
            if len(kinds) == 1:
                return kinds.pop()
            if not kinds and any(getattr(self, k) is not None for k in ("min", "max", "gt", "lt")):
                return float  # numeric rules on an empty default: numbers
            return None
        return None if d is None else type(d)

    def describe(self) -> str:
        kind = type(self.default).__name__
        el = self.element_type()
        if isinstance(self.default, list) and el is not None:
            kind = f"list of {el.__name__}"
        elif self.default is None and el is not None:
            kind = f"None or {el.__name__}"
        elif isinstance(self.default, dict):
            kind = f"mapping with keys from {self.keys if self.keys is not None else sorted(self.default)}"
        parts = [kind]
        if self.kind is not None:
            parts.append(KINDS[self.kind][1])
        for key, text in (("path", "an existing {} or empty"), ("choices", "one of {}"), ("items", "elements from {}"), ("min", ">= {}"), ("gt", "> {}"),
                          ("max", "<= {}"), ("lt", "< {}"), ("min_len", "at least {} element(s)"),
                          ("max_len", "at most {} element(s)")):
            if getattr(self, key) is not None:
                parts.append(text.format(getattr(self, key)))
        return ", ".join(parts)

    def _error(self, why: str) -> ParameterError:
        return ParameterError(f"parameter {self.name!r}: {why}; allowed: {cut(self.describe())}")

    def _scalar(self, x, kind, what: str = ""):
        """One value (or list element, `what` = "element ") checked against the type and the numeric rules."""
        x = _plain(x)
        if kind is int and isinstance(x, float) and x.is_integer() and abs(x) <= 2**53:
            x = int(x)  # 1e3, as papermill and YAML 1.2 read it: a float that is a whole number
        shown = short(x)
        if kind is bool:
            if not isinstance(x, bool):
                raise self._error(f"{what}{shown} is not a bool")
        elif kind is int:
            if isinstance(x, bool) or not isinstance(x, int):
                raise self._error(f"{what}{shown} is not an int")
        elif kind is float:
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                raise self._error(f"{what}{shown} is not a number")
            if not math.isfinite(x):
                raise self._error(f"{what}{shown} is not a finite number")
            x = float(x)
            shown = short(x)
        elif kind is str:
            if not isinstance(x, str):
                raise self._error(f"{what}{shown} is not a string")
        elif kind is None:
            if not isinstance(x, (bool, int, float, str)) and x is not None:
                raise self._error(f"{what}{shown} is not a single value")
            if isinstance(x, float) and not math.isfinite(x):
                raise self._error(f"{what}{shown} is not a finite number")
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            for key, bad, text in (("min", lambda b: x < b, "below the minimum"),
                                   ("gt", lambda b: x <= b, "not above"),
                                   ("max", lambda b: x > b, "above the maximum"),
                                   ("lt", lambda b: x >= b, "not below")):
                bound = getattr(self, key)
                if bound is not None and bad(bound):
                    raise self._error(f"{what}{shown} is {text}" + (f" {bound}" if key in ("gt", "lt") else ""))
        if isinstance(x, int) and not isinstance(x, bool) and abs(x) > INT_MAX:
            raise self._error(f"{what}{shown} does not fit in a 64-bit integer")
        if self.kind is not None and isinstance(x, str) and not KINDS[self.kind][0].fullmatch(x):
            raise self._error(f"{what}{shown} is not {KINDS[self.kind][1].split(':')[0]}")
        return x

    def check(self, value):
        """Return `value` (ints converted for floats) or raise ParameterError saying what is allowed."""
        d, kind = self.default, self.element_type()
        if isinstance(value, tuple) or type(value).__name__ == "ndarray":
            value = list(value)
        if isinstance(d, dict):
            return self._mapping(value)
        if isinstance(d, list):
            if not isinstance(value, list):
                raise self._error(f"{short(value)} is not a list")
            if self.min_len is not None and len(value) < self.min_len:
                need = "is not a non-empty list" if self.min_len == 1 else f"has {len(value)} elements"
                raise self._error(f"{short(value)} {need}; at least {self.min_len} needed")
            if self.max_len is not None and len(value) > self.max_len:
                raise self._error(f"{short(value)} has {len(value)} elements; at most {self.max_len} allowed")
            out = []
            for x in value:
                out.append(self._scalar(x, kind, "element "))
                if self.items is not None and out[-1] not in self.items:
                    raise self._error(f"element {short(x)} is not allowed")
            value = out
        elif d is None:
            value = None if value is None else self._scalar(value, kind)
        else:
            value = self._scalar(value, kind)
        if self.choices is not None and value not in self.choices:
            raise self._error(f"{short(value)} is not allowed")
        if self.path is not None and value:
            # the kernel runs in the notebook's folder: a path relative to the caller's is made absolute
            found = Path(value).expanduser().absolute()
            if not (found.is_file() if self.path == "file" else found.is_dir()):
                raise self._error(f"{short(value)} is not an existing {self.path}")
            if not os.access(found, os.R_OK):
                raise self._error(f"{short(value)} is not readable")
            value = str(found)
        return value

    def _mapping(self, value) -> dict:
        """A dict parameter: names from `keys` (default: the default's keys), each value checked like
        the default's value under that key (same type, the numeric rules of this parameter); keys
        left out keep the default's value."""
        if not isinstance(value, dict):
            raise self._error(f"{short(value)} is not a mapping")
        allowed = self.keys if self.keys is not None else list(self.default)
        out = dict(self.default)
        for key, x in value.items():
            if not isinstance(key, str) or key not in allowed:
                raise self._error(f"key {short(key)} is not allowed")
            rules = {k: getattr(self, k) for k in ("min", "max", "gt", "lt")}
            sub = ParameterSpec(f"{self.name}.{key}", self.default.get(key), **rules)
            if isinstance(x, (list, tuple)) and not isinstance(sub.default, list):
                sub = ParameterSpec(sub.name, [], **rules)
            try:
                out[key] = sub.check(x)
            except ParameterError as err:
                raise ParameterError(f"{err}".split("; allowed:")[0] + f"; allowed: {cut(self.describe())}") from None
        return out


def _comments(source: str) -> dict[int, str]:
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string[1:].strip()
    return out


def _rules(comment: str, where: str) -> tuple[dict, str]:
    """The YAML mapping `{...}` that ends a comment, and the comment without it."""
    if not (comment.endswith("}") and "{" in comment):
        return {}, comment
    text = comment[comment.rindex("{"):]
    try:
        rules = parse_yaml(text) or {}
    except ValueError as err:
        raise ValueError(f"{where}: unreadable rule {text!r}: {err}") from None
    if not isinstance(rules, dict):
        raise ValueError(f"{where}: rule {text!r} is not a mapping")
    return rules, comment[: comment.rindex("{")].strip()


def _parameter_cell(name: str) -> str:
    nb = notebooks.read_notebook(name)
    cells = [c for c in nb.cells if c.cell_type == "code" and "parameters" in c.metadata.get("tags", [])]
    if len(cells) != 1:
        raise ValueError(f"{name}: a notebook needs exactly one cell tagged 'parameters', found {len(cells)}")
    return cells[0].source


def notebook_rules(name: str, path: Path | None = None) -> dict:
    """What `RULES_FILE` (params/rules.yaml) says of notebook `name`: `{"memory_bytes": EXPR,
    "rules": {parameter: {rule: value}}}` (either may be absent). The file keeps, outside the
    notebooks, the rules a parameter cell's comments do not state: free text that names a network
    (`kind: network`), file parameters (`path: file`), the keys of a dict parameter, and each
    notebook's memory estimate."""
    path = RULES_FILE if path is None else Path(path)
    if not path.is_file():
        return {}
    entry = load_yaml_mapping(path, "rules file", ValueError).get(name) or {}
    if not isinstance(entry, dict) or set(entry) - {"memory_bytes", "rules"} or not isinstance(entry.get("rules", {}), dict):
        raise ValueError(f"{path}: the entry of {name} must be a mapping with memory_bytes and rules")
    return entry


def parameter_specs(name: str) -> dict[str, ParameterSpec]:
    """The notebook's parameters with their defaults and allowed values (`RULE_KEYS`), from the
    parameter cell's comments and `notebook_rules`; each default must obey its own rules."""
    source = _parameter_cell(name)
    defaults = notebooks.parameter_defaults_from_source(source)
    comments = _comments(source)
    lines = {node.lineno: node.targets[0].id for node in ast.parse(source).body}
    outside = notebook_rules(name).get("rules", {})
    specs = {}
    for lineno, pname in lines.items():
        where = f"{name}: parameter {pname}"
        rules, comment = _rules(comments.get(lineno, ""), where)
        extra = outside.get(pname) or {}
        if not isinstance(extra, dict):
            raise ValueError(f"{RULES_FILE}: rules of {where} must be a mapping")
        clash = sorted(k for k in set(rules) & set(extra) if rules[k] != extra[k])
        if clash:
            raise ValueError(f"{where}: the parameter cell and {RULES_FILE.name} disagree on {clash}")
        rules = {**rules, **extra}
        unknown = set(rules) - set(RULE_KEYS)
        if unknown:
            raise ValueError(f"{where}: unknown rule keys {sorted(unknown)}; rules are {list(RULE_KEYS)}")
        specs[pname] = spec = ParameterSpec(pname, defaults[pname], comment, **rules)
        try:
            spec.check(defaults[pname])
        except ParameterError as err:
            raise ValueError(f"{name}: the default breaks its own rule: {err}") from None
    return specs


def memory_estimate(name: str) -> str | None:
    """The notebook's memory estimate: a comment line `# {memory_bytes: "EXPR"}` in its parameter
    cell, else its `memory_bytes` in `RULES_FILE`; EXPR an arithmetic expression of the parameters
    (bytes; `len`, `max`, `min`, `sum`, `prod` allowed). None if neither states one."""
    source = _parameter_cell(name)
    found = None
    for lineno, comment in _comments(source).items():
        rules, _ = _rules(comment, f"{name}: parameter cell line {lineno}")
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


# YAML as the parameters are read everywhere (`-p` values, --params files, sweep specs, rule
# comments): the safe loader; numbers as papermill and YAML 1.2 read them (1e-3 and 1.0e3 are
# floats, where YAML 1.1 reads them as text); merge keys (`<<: *base`); no repeated key; and a
# bounded size once aliases are expanded (an "alias bomb" of a few hundred bytes stands for
# billions of values: refused before anything walks it).
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


def _load_yaml(path) -> dict:
    return load_yaml_mapping(path)


def resolve_parameters(name: str, *, scale: str = "ci", params_file=None, overrides: dict | None = None,
                       memory: bool = True) -> dict:
    """The full parameter set of a run: defaults, then the paper YAML (scale="paper"), then a
    user's YAML, then `overrides`. Every given name and value is checked against the parameter
    cell, and (`memory`, for a run on this machine) the whole set against the notebook's memory
    estimate."""
    if scale not in ("ci", "paper"):
        raise ParameterError(f"scale must be 'ci' or 'paper', got {scale!r}")
    specs = parameter_specs(name)
    given: dict = {}
    if scale == "paper":
        path = notebooks.paper_params_path(name)
        if not path.is_file():
            raise ParameterError(f"{name} has no paper-scale parameter file {path}")
        given.update(_load_yaml(path))
    user = _load_yaml(params_file) if params_file is not None else {}
    bad = [k for k in (overrides or {}) if not isinstance(k, str)]
    if bad:
        raise ParameterError(f"parameter names must be strings, got {short(bad[0])}")
    user.update(overrides or {})
    if "scale" in user:
        raise ParameterError("'scale' labels the starting point (ci defaults or the paper YAML): set it with --scale")
    given.update(user)
    resolved = {k: s.default for k, s in specs.items()}
    for key, value in given.items():
        if key not in specs:
            close = difflib.get_close_matches(key, list(specs), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; parameters are {sorted(specs)}"
            raise ParameterError(f"{name} has no parameter {key!r}{hint}")
        resolved[key] = specs[key].check(value)
    if memory:
        check_memory(name, resolved)
    return resolved
