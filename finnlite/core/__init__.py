"""The ground floor: the model class, datatypes, errors, the pass machinery and registry, verification policies and
graph helpers. Nothing here imports ``custom_ops``, ``streamline``, ``verify`` or the faces above them."""
