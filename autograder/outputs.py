"""The form of a rank's result, declared by the lab for each call and checked before a judge
reads it.

A result arrives as a tree the courier decoded (`autograder.sandbox.channel.unpack_counted`:
at most RESULT_NODES values and RESULT_BYTES bytes per launch, every tensor with bytes of its
own). That bounds what the grader *holds*, not what a judge *computes*: a (2²¹, 1, 1) bfloat16
"gradient" (4 MB) broadcast against a (3, 6) reference is a (2²¹, 3, 6) float64 tensor, and lab
06's judges reached 5.4 GB that way. So every lab declares, per call, the form its harness
returns (``OUTPUTS`` in checks.py: call name → ``form(case, inputs, rank, world_size)``, from
the case's public parameters and that rank's inputs), and `conform` checks every rank's result
against it before any judge runs: each tensor's shape (exact, or at most `Tensor.max_numel`
elements where the student's code decides the shape and the judge names a wrong one), its
dtype, every list's length and every dict's keys. What the form does not declare is dropped, so
a judge reads nothing else.

Forms, as Python values:

* `Tensor(shape, dtypes)`: a tensor of exactly that shape (or, with ``shape=None``, of at most
  ``max_numel`` elements) and one of ``dtypes`` (names such as "float32"; None: any);
* a ``list`` of forms: a list or tuple of exactly that many items, item k of form k;
* `Seq(form, length)`: a list of ``length`` items (None: any number, each counted by the
  courier's RESULT_NODES) of one form;
* a ``dict`` of forms: a dict holding every key, each of its form (other keys are dropped; a
  key whose form is `Maybe` may be absent); `Mapping(form)`: a dict with any text keys, each
  value of that form;
* `Maybe(form)`: None or that form; `Either(a, b, ...)`: the first form that fits;
* ``int``, ``float`` (an int too), ``bool``, ``str``, `SCALAR` (any of those or None).

A number is finite unless its form says otherwise: ``float`` and `SCALAR` refuse NaN and ±inf
(a result's frame carries them as ``{"__float__": "nan"}``), and `Float(nonfinite=True)` is
the form of a number that may be one. A judge testing ``abs(got - want) > tol`` let NaN
through, since every comparison with NaN is False (red team 8: lab 04's ``bubble_fraction``
returning NaN passed its formula check). Refused here, no judge sees one; judges still write
their tests so that NaN fails (``not abs(got - want) <= tol``). Tensors may hold any value:
lab 06's gradients hold the inf a case injects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

FLOATS = frozenset({"float64", "float32", "float16", "bfloat16"})


@dataclass(frozen=True)
class Tensor:
    """A tensor of `shape` (a tuple of ints; None: any shape of at most `max_numel` elements)
    and a dtype in `dtypes` (None: any)."""

    shape: tuple[int, ...] | None = None
    dtypes: frozenset[str] | None = None
    max_numel: int | None = None

    def __post_init__(self) -> None:
        if self.shape is None and self.max_numel is None:
            raise ValueError("Tensor(): give its shape, or max_numel for a shape the student's "
                             "code decides")
        if self.shape is not None:
            object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if self.dtypes is not None:
            object.__setattr__(self, "dtypes", frozenset(self.dtypes))

    @staticmethod
    def like(t: torch.Tensor, dtypes: frozenset[str] | None = None) -> "Tensor":
        """A tensor of `t`'s shape and dtype (or one of `dtypes`)."""
        return Tensor(tuple(t.shape), dtypes or frozenset({str(t.dtype).removeprefix("torch.")}))


@dataclass(frozen=True)
class Seq:
    """A list of `length` items (None: any number) of one form."""

    item: Any
    length: int | None = None


@dataclass(frozen=True)
class Mapping:
    """A dict with any text keys (each counted by the courier's RESULT_NODES), every value of
    one form."""

    value: Any


@dataclass(frozen=True)
class Maybe:
    """None, or `form`."""

    form: Any


class Either:
    """The first of `forms` that fits."""

    def __init__(self, *forms: Any) -> None:
        self.forms = forms


@dataclass(frozen=True)
class Float:
    """A number (an int too), finite unless `nonfinite` (then NaN and ±inf too). The form
    ``float`` is ``Float()``."""

    nonfinite: bool = False


SCALAR = "scalar"
"""None, a bool, an int, a finite float or a str."""

Form = Callable[[dict, Any, int, int], Any]
"""What a lab declares per call: (case, this rank's inputs, rank, world size) → its form."""


class OutputError(ValueError):
    """A result that does not have its declared form: `path` (e.g. ``['final']['a.weight']``)
    and what is wrong there."""

    def __init__(self, path: str, what: str) -> None:
        super().__init__(f"at {path}: {what}" if path else what)
        self.path, self.what = path, what


def _kind(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {tuple(value.shape)}"
    return f"{type(value).__name__} {str(value)[:40]!r}" if value is not None else "None"


def conform(value: Any, form: Any, path: str = "") -> Any:
    """`value` checked against `form` (see the module docstring): the same value with only the
    declared dict keys; OutputError at the first place that differs. Linear in the tree, and
    no arithmetic on any tensor."""
    if isinstance(form, Tensor):
        if not isinstance(value, torch.Tensor):
            raise OutputError(path, f"expected a tensor, got {_kind(value)}")
        dtype = str(value.dtype).removeprefix("torch.")
        if form.dtypes is not None and dtype not in form.dtypes:
            raise OutputError(path, f"a {dtype} tensor, expected "
                                    f"{' or '.join(sorted(form.dtypes))}")
        if form.shape is not None and tuple(value.shape) != form.shape:
            raise OutputError(path, f"shape {tuple(value.shape)}, expected {form.shape}")
        if form.shape is None and value.numel() > form.max_numel:
            raise OutputError(path, f"{value.numel():,} elements (shape {tuple(value.shape)}); "
                                    f"at most {form.max_numel:,} expected")
        return value
    if isinstance(form, Maybe):
        return None if value is None else conform(value, form.form, path)
    if isinstance(form, Either):
        errors = []
        for option in form.forms:
            try:
                return conform(value, option, path)
            except OutputError as err:
                errors.append(err)
        raise errors[0]
    if isinstance(form, (list, Seq)):
        if not isinstance(value, (list, tuple)):
            raise OutputError(path, f"expected a list, got {_kind(value)}")
        want = len(form) if isinstance(form, list) else form.length
        if want is not None and len(value) != want:
            raise OutputError(path, f"{len(value)} items, expected {want}")
        items = form if isinstance(form, list) else [form.item] * len(value)
        return [conform(v, f, f"{path}[{k}]") for k, (v, f) in enumerate(zip(value, items))]
    if isinstance(form, (dict, Mapping)):
        if not isinstance(value, dict):
            raise OutputError(path, f"expected a dict, got {_kind(value)}")
        if isinstance(form, Mapping):
            return {k: conform(v, form.value, f"{path}[{k!r}]") for k, v in value.items()}
        missing = [k for k, f in form.items() if k not in value and not isinstance(f, Maybe)]
        if missing:
            raise OutputError(path, f"no {', '.join(map(repr, missing[:4]))} in it")
        return {k: conform(value[k], f, f"{path}[{k!r}]") for k, f in form.items()
                if k in value}
    if form is SCALAR:
        if isinstance(value, float):
            return _number(value, Float(), path)
        if value is None or isinstance(value, (bool, int, str)):
            return value
        raise OutputError(path, f"expected a number or text, got {_kind(value)}")
    if form is float or isinstance(form, Float):
        return _number(value, form if isinstance(form, Float) else Float(), path)
    if form in (int, bool, str):
        if isinstance(value, form) and (form is bool or not isinstance(value, bool)):
            return value
        raise OutputError(path, f"expected {form.__name__}, got {_kind(value)}")
    raise TypeError(f"conform: {form!r} is not a form (see autograder.outputs)")


def _number(value: Any, form: Float, path: str) -> int | float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise OutputError(path, f"expected a number, got {_kind(value)}")
    if not form.nonfinite and isinstance(value, float) and not math.isfinite(value):
        raise OutputError(path, f"{value!r}: a finite number expected (NaN and infinities "
                                "are not results here)")
    return value


def state_form(state: dict[str, torch.Tensor], dtypes: frozenset[str] = FLOATS) -> dict:
    """A state dict's form: every entry of `state` with its shape, any of `dtypes`."""
    return {name: Tensor(tuple(t.shape), dtypes) for name, t in state.items()}


__all__ = ["FLOATS", "SCALAR", "Either", "Float", "Form", "Mapping", "Maybe", "OutputError",
           "Seq", "Tensor", "conform", "state_form"]
