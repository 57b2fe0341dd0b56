"""FSDP's units: which parameters a unit owns, found once each, tied ones included.

Zhao et al., "PyTorch FSDP", VLDB 2023, §3: a model is wrapped unit by unit; each unit's
parameters are flattened, sharded and gathered together. Here a parameter belongs to the unit
whose subtree holds *every* use of it; one used outside all units (TinyGPT's tied embedding and
head) or tied across two units belongs to the root, gathered for the whole forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

Slot = tuple[nn.Module, str]  # a module and the attribute name a parameter lives under


@dataclass
class ParamInfo:
    """One distinct parameter of the wrapped module, found once however often it is used."""

    param: nn.Parameter
    name: str
    """Its first name in the module (the state-dict key)."""
    slots: list[Slot] = field(default_factory=list)
    """Every (module, attribute) holding it: several for a tied parameter."""
    units: set[int | None] = field(default_factory=set)
    """The unit (index) of each module that uses it; None: a module outside every unit."""

    @property
    def unit(self) -> int | None:
        """The unit that owns it: the only one using it, else None (the root: used outside the
        units, or tied across two of them)."""
        return next(iter(self.units)) if len(self.units) == 1 else None


def default_units(module: nn.Module) -> list[nn.Module]:
    """``module.blocks``, else ``module.layers``: the children that hold parameters."""
    for attr in ("blocks", "layers"):
        children = getattr(module, attr, None)
        if isinstance(children, (nn.ModuleList, nn.Sequential)):
            return [m for m in children if any(True for _ in m.parameters())]
    return []


def unit_parameters(module: nn.Module, units: list[nn.Module]) -> list[ParamInfo]:
    """Every distinct parameter of `module` once, in module order, with all its slots and the
    units that use it (a tied parameter: one entry, several slots)."""
    unit_of = {id(m): i for i, u in enumerate(units) for m in u.modules()}
    found: dict[int, ParamInfo] = {}  # by id(): the one way to tell a tied parameter is the same
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        for attr, p in list(mod._parameters.items()):
            if p is None:
                continue
            info = found.setdefault(id(p), ParamInfo(p, f"{mod_name}.{attr}" if mod_name else attr))
            info.slots.append((mod, attr))
            info.units.add(unit_of.get(id(mod)))
    return list(found.values())


__all__ = ["ParamInfo", "Slot", "default_units", "unit_parameters"]
