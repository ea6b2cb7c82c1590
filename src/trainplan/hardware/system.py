"""A system: an accelerator times a device count, with its node and scale-up topology.

``scale_up_domain`` is the number of devices that share the scale-up fabric (8 on an HGX
board, 72 in an NVL72 rack, the ICI slice on TPU); collectives inside it use
``accelerator.scale_up`` and collectives across domains use ``accelerator.scale_out``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trainplan.errors import CatalogError, TrainplanError
from trainplan.hardware.accelerator import Accelerator, CloudOffering
from trainplan.limits import MAX_DEVICES, check_int

if TYPE_CHECKING:
    from trainplan.comm import Network


@dataclass(frozen=True, kw_only=True)
class System:
    """``accelerator`` × ``num_devices``.

    ``devices_per_node`` and ``scale_up_domain`` default (when 0) to the accelerator's
    ``devices_per_node`` and ``scale_up.domain_size``; the scale-up domain is capped by
    ``num_devices`` (a 4-GPU job on an NVL72 rack has a 4-device domain).
    ``host_memory_bytes_per_node`` defaults (when ``None``) to the accelerator's reference
    server; it stays ``None`` when the catalog has none (offloaded states are then unchecked,
    and the estimate says so). ``offering`` is the
    price to use; ``None`` means the catalog default, the cheapest listed cloud offering (see
    :attr:`price`).
    """

    accelerator: Accelerator
    num_devices: int
    devices_per_node: int = 0
    scale_up_domain: int = 0
    host_memory_bytes_per_node: float | None = None
    nvme_bytes_per_s_per_node: float | None = None
    offering: CloudOffering | None = None
    host_memory_given: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        if not isinstance(self.accelerator, Accelerator):
            raise CatalogError("hardware", "system needs an Accelerator; see `trainplan hardware list`")
        check_int("num_devices", self.num_devices, high=MAX_DEVICES, what="devices")
        for key, default in (
            ("devices_per_node", self.accelerator.devices_per_node),
            ("scale_up_domain", self.accelerator.scale_up.domain_size),
        ):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise TrainplanError(key, f"must be a positive integer (0 = catalog default), got {value!r}")
            if value == 0:
                object.__setattr__(self, key, default)
        object.__setattr__(self, "scale_up_domain", min(self.scale_up_domain, self.num_devices))
        for key in ("host_memory_bytes_per_node", "nvme_bytes_per_s_per_node"):
            value = getattr(self, key)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or not value > 0
            ):
                raise TrainplanError(key, f"must be a positive number of bytes (or bytes/s), got {value!r}")
        if self.host_memory_bytes_per_node is None:
            object.__setattr__(
                self, "host_memory_bytes_per_node", self.accelerator.host_memory_bytes_per_node
            )
        else:
            object.__setattr__(self, "host_memory_given", True)
        if self.offering is not None and not isinstance(self.offering, CloudOffering):
            raise TrainplanError("offering", "must be a CloudOffering or None")

    @functools.cached_property
    def network(self) -> Network:
        """The two link levels its collectives run on (:func:`trainplan.comm.network_from_system`
        at the catalog's efficiencies), built once per system: every estimate on it reads them."""
        from trainplan.comm import network_from_system

        return network_from_system(self)

    @property
    def num_nodes(self) -> int:
        """Servers needed: ceil(num_devices / devices_per_node)."""
        return math.ceil(self.num_devices / self.devices_per_node)

    @property
    def devices_on_a_node(self) -> int:
        """This job's accelerators on one server: min(num_devices, devices_per_node)."""
        return min(self.num_devices, self.devices_per_node)

    @property
    def host_memory_source(self) -> str:
        """Where ``host_memory_bytes_per_node`` comes from: the user, the catalog, or nowhere."""
        if self.host_memory_given:
            return "given (--host-memory)"
        if self.host_memory_bytes_per_node is None:
            return "unknown (no reference server in the catalog; give --host-memory)"
        return self.accelerator.sources.get("host_memory", "catalog")

    @property
    def num_scale_up_domains(self) -> int:
        return math.ceil(self.num_devices / self.scale_up_domain)

    @property
    def price(self) -> CloudOffering | None:
        """The offering used for cost: the chosen one, else the cheapest listed, else ``None``."""
        return self.offering if self.offering is not None else self.accelerator.cheapest_offering()

    @property
    def usd_per_hour(self) -> float | None:
        """Whole-system rental price per hour, ``None`` when no price is known."""
        price = self.price
        return None if price is None else price.usd_per_device_hour * self.num_devices

    @property
    def memory_bytes(self) -> float:
        """Total device memory of the system."""
        return self.accelerator.memory_bytes * self.num_devices

    def to_dict(self) -> dict[str, object]:
        price = self.price
        return {
            "accelerator": self.accelerator.name,
            "num_devices": self.num_devices,
            "devices_per_node": self.devices_per_node,
            "num_nodes": self.num_nodes,
            "scale_up_domain": self.scale_up_domain,
            "host_memory_bytes_per_node": self.host_memory_bytes_per_node,
            "host_memory_source": self.host_memory_source,
            "nvme_bytes_per_s_per_node": self.nvme_bytes_per_s_per_node,
            "offering": None if price is None else price.to_dict(),
            "usd_per_hour": self.usd_per_hour,
        }
