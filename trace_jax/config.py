"""Typed, frozen configuration dataclasses shared across the project."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Device mesh sizes for the axes (data, fsdp, tensor); one size may be -1 (fill)."""

    data: int = -1
    fsdp: int = 1
    tensor: int = 1

    def __post_init__(self) -> None:
        sizes = (self.data, self.fsdp, self.tensor)
        if any(s == 0 or s < -1 for s in sizes):
            raise ValueError(f"mesh sizes must be positive or -1 (fill), got data={self.data}, "
                             f"fsdp={self.fsdp}, tensor={self.tensor}")
        if sizes.count(-1) > 1:
            raise ValueError("at most one mesh axis may be -1 (fill); set the others explicitly")

    def resolve(self, num_devices: int) -> tuple[int, int, int]:
        """Concrete (data, fsdp, tensor) sizes for `num_devices`, filling the -1 axis."""
        sizes = [self.data, self.fsdp, self.tensor]
        known = 1
        for s in sizes:
            known *= s if s != -1 else 1
        if -1 in sizes:
            if num_devices % known:
                raise ValueError(f"cannot fill mesh: {num_devices} devices are not divisible by the "
                                 f"fixed axes product {known} (data={self.data}, fsdp={self.fsdp}, "
                                 f"tensor={self.tensor})")
            sizes[sizes.index(-1)] = num_devices // known
        elif known != num_devices:
            raise ValueError(f"mesh data*fsdp*tensor = {known} but {num_devices} devices are "
                             "available; set one axis to -1 to fill")
        return tuple(sizes)  # type: ignore[return-value]
