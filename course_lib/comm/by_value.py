"""How an object defined in a notebook reaches the engines: by value, not by name (lectures 4 and 7).

Plain pickle names an object's class (``__main__.MyCompressor``); an engine has no copy of the
notebook's ``__main__``, so it could not rebuild the object. An object whose class mixes in
:class:`ByValue` sends the class itself (cloudpickle carries the class and the functions its
methods call) unless the class is the kit's own, reachable by name (every engine has the kit):
a class from a notebook, a test file, a student's module or a function's body travels by value. Compressors (lecture 7) and gradient-exchange methods (lecture 4) use it, so a
student's own method or compressor is passed to ``train_data_parallel`` like a built-in one.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

__all__ = ["ByValue"]


class ByValue:
    """Mix-in: instances of a class that is not the kit's own pickle with their class, by value."""

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickle by name when the class is the kit's own, else by value."""
        cls = type(self)
        module = cls.__module__
        if module.split(".")[0] == "course_lib" and "<locals>" not in cls.__qualname__:
            return super().__reduce_ex__(protocol)
        import cloudpickle

        by_value = module != "__main__" and module in sys.modules  # an importable module here
        if by_value:  # ... that the engines may not have: send its functions too
            cloudpickle.register_pickle_by_value(sys.modules[module])
        try:
            cls_bytes = cloudpickle.dumps(cls)
        finally:
            if by_value:
                cloudpickle.unregister_pickle_by_value(sys.modules[module])
        getstate = getattr(self, "__getstate__", None)  # object.__getstate__ is Python 3.11+
        state = (getstate() if getstate else None) or self.__dict__
        return _rebuild_by_value, (cls_bytes, copy.copy(state))


def _rebuild_by_value(cls_bytes: bytes, state: dict[str, Any]) -> Any:
    """Return an instance of the cloudpickled class ``cls_bytes`` holding ``state``."""
    import cloudpickle

    cls = cloudpickle.loads(cls_bytes)
    obj = cls.__new__(cls)
    if hasattr(obj, "__setstate__"):  # a class that rebuilds what it did not pickle (a codec)
        obj.__setstate__(state)
    else:
        obj.__dict__.update(state)
    return obj
