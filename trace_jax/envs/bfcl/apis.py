"""An episode's own API instances, and calls run on them by name, checked against the functions offered.

The instances are built as bfcl-eval's `execute_multi_turn_func_call` builds them (each involved class imported from
its func_source_code module, instantiated, its scenario loaded from a deep copy of the entry's initial configuration
unless it is stateless) but held by the episode, never in bfcl's module globals, and copied once loaded: a
long-context scenario puts dicts of the package's long_context module into the state (TravelAPI's extra credit
cards, whose balance a booking then changes for every later instance). A call runs only if its function is among
the docs given (an episode gives all of its classes' functions, as bfcl runs a held-out one) and its arguments fit
the function's doc; it is looked up as an attribute, never evaluated.
Results are strings in bfcl's form: a str as is, a dict as JSON (else its str), anything else its str, an error as
"Error during execution: <message>".
"""

from __future__ import annotations

import copy
import decimal
import importlib
import inspect
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import mpmath
from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

from trace_jax.envs.bfcl.calls import Call, parse_call_string

if TYPE_CHECKING:
    from trace_jax.envs.bfcl.data import Entry

ERROR = "Error during execution: {}"
MAX_INT, MAX_DEPTH = 2**63, 8  # bounds on argument values: their size, and how deeply lists and dicts nest
# MathAPI sets mpmath's and decimal's precision to `precision` and computes base**exponent exactly: unbounded, one
# call could run for hours. The ground truth uses precision <= 10.
LIMITS = {("logarithm", "precision"): 1000, ("square_root", "precision"): 1000, ("power", "exponent"): 1000}
# What a doc type admits. A scalar admits any JSON scalar, as bfcl's execution does: the package's own data breaks
# the scalar types (ticket ids documented as integers are strings in some scenarios and in their ground truth).
SCALAR = (str, int, float)  # bool is an int
TYPES: dict[str, tuple[type, ...]] = {"array": (list,), "tuple": (list,), "dict": (dict,), "string": SCALAR,
                                      "integer": SCALAR, "float": SCALAR, "number": SCALAR, "boolean": SCALAR}


class Apis:
    """The instances of an entry's involved classes, {class name: instance}, and the class owning each public method.
    Deep-copying an Apis copies the episode's whole API state."""

    def __init__(self, involved_classes: tuple[str, ...], initial_config: Mapping[str, Any], long_context: bool):
        self.instances: dict[str, Any] = {}
        self.owner: dict[str, str] = {}  # method name -> class name (bfcl: the last involved class defining it)
        for name in involved_classes:
            instance = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)()
            if name not in STATELESS_CLASSES:
                instance._load_scenario(copy.deepcopy(initial_config.get(name, {})), long_context=long_context)
                instance = copy.deepcopy(instance)  # long-context scenarios hold the package's module-level dicts
            self.instances[name] = instance
            self.owner.update({m: name for m, _ in inspect.getmembers(instance, inspect.ismethod)
                               if not m.startswith("_")})

    @classmethod
    def of(cls, entry: Entry) -> Apis:
        """Fresh instances of an entry's classes, loaded from its initial configuration."""
        return cls(entry.involved_classes, entry.initial_config, entry.long_context)

    def run(self, call: Call, docs: Mapping[str, dict[str, Any]]) -> str:
        """The result string of `call`, run if `docs` ({name: BFCL doc}, the functions offered now) has its function
        and its arguments fit that doc; else the error string saying why. Never raises."""
        doc = docs.get(call.name)
        if doc is None or call.name not in self.owner:
            return ERROR.format(f"no function named {call.name!r} is available now; call one of the listed tools")
        problem = argument_error(call, doc)
        if problem:
            return ERROR.format(problem)
        method = getattr(self.instances[self.owner[call.name]], call.name)
        precision, context = mpmath.mp.prec, decimal.getcontext().prec
        try:
            return result_string(method(**call.arguments))
        except Exception as exc:  # an API method that raised: bfcl's error result
            return ERROR.format(exc)
        finally:  # MathAPI sets these process-wide precisions: restore them after its result is a string
            mpmath.mp.prec, decimal.getcontext().prec = precision, context

    def bind(self, text: str) -> Call:
        """The Call of a call string (ground truth, a `--calls` file): positional values named by the method's own
        signature, as Python would bind them. Raises ValueError naming the problem."""
        name, args, kwargs = parse_call_string(text)
        if name not in self.owner:
            raise ValueError(f"no function named {name!r} in {sorted(self.instances)}")
        method = getattr(self.instances[self.owner[name]], name)
        try:
            return Call(name, dict(inspect.signature(method).bind(*args, **kwargs).arguments))
        except TypeError as exc:
            raise ValueError(f"{name}: {exc}") from None

    def run_string(self, text: str, docs: Mapping[str, dict[str, Any]]) -> str:
        """`run` of a call string (error string if it does not parse or bind). Never raises."""
        try:
            call = self.bind(text)
        except ValueError as exc:
            return ERROR.format(exc)
        return self.run(call, docs)


def result_string(value: Any) -> str:
    """bfcl's string of a result: a str as is, a dict as JSON (or its str when not serialisable), else str."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def argument_error(call: Call, doc: dict[str, Any]) -> str | None:
    """Why `call`'s arguments do not fit its BFCL doc (names, required ones, containers where the doc has them and
    scalars elsewhere, sizes), or None."""
    params = doc["parameters"].get("properties", {})
    required = set(doc["parameters"].get("required", []))
    unknown = sorted(set(call.arguments) - set(params))
    if unknown:
        return f"{call.name} has no argument {', '.join(unknown)}; its arguments are {', '.join(params) or 'none'}"
    missing = sorted(required - set(call.arguments))
    if missing:
        return f"{call.name} needs the argument {', '.join(missing)}"
    for key, value in call.arguments.items():
        if value is None and key not in required:
            continue  # an optional argument left at None
        problem = _value_error(value, params[key], depth=0)
        if problem:
            return f"{call.name} argument {key!r}: {problem}"
        limit = LIMITS.get((call.name, key))
        if limit is not None and (type(value) not in (int, float) or abs(value) > limit):
            return f"{call.name} argument {key!r}: expected a number of magnitude at most {limit}, got {value!r}"
    return None


def _value_error(value: Any, schema: dict[str, Any], depth: int) -> str | None:
    if depth > MAX_DEPTH:
        return f"values nest deeper than {MAX_DEPTH} levels"
    kind = schema.get("type")
    allowed = TYPES.get(kind)
    if allowed is not None and not isinstance(value, allowed):
        return f"expected {kind}, got {_json_type(value)}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= MAX_INT:
        return f"the integer {value} does not fit in 64 bits"
    if isinstance(value, list):
        items = schema.get("items", {})
        return next((p for v in value if (p := _value_error(v, items, depth + 1))), None)
    if isinstance(value, dict):
        return next((p for v in value.values() if (p := _value_error(v, {}, depth + 1))), None)
    return None


def _json_type(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "float", str: "string", list: "array", dict: "object",
            type(None): "null"}.get(type(value), type(value).__name__)
