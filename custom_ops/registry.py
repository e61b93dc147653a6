"""The op registry: the core's (:mod:`finnlite.core.ops`), under the names the op modules and the rules use. Each op
module registers its classes with :func:`register` when imported; :mod:`custom_ops` imports every op module
explicitly, so nothing is found by ``eval`` or depends on import order."""

from finnlite.core.ops import (CUSTOM_DOMAINS, HW_DOMAIN, QONNX_DOMAIN, STANDARD_DOMAINS, is_custom_domain,
                               is_standard_domain, lookup, make_op, register, register_alias, registered_ops)

__all__ = ["CUSTOM_DOMAINS", "HW_DOMAIN", "QONNX_DOMAIN", "STANDARD_DOMAINS", "is_custom_domain", "is_standard_domain",
           "lookup", "make_op", "register", "register_alias", "registered_ops"]
